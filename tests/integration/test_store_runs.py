"""The run history part of the store contract, on real Redis, PostgreSQL and SQLite.

Runs are written only by the audit events that carry their changes (as the layer writes
them: ``add_audit``, and riding ``claim`` / ``complete``), so these tests write events and
read runs. Each backend gets its own isolated storage (a random Redis prefix in the
store's test database, random PostgreSQL table names in the run's own database, a new
SQLite file).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from conventions.observability import audit, runs
from conventions.ops import retention
from conventions.store import RedisStore, SQLStore, Store, keys, redis_runs
from conventions.store import runs as runs_store
from conventions.store.records import AuditEvent
from conventions.store.runs import MAX_ATTEMPTS, MAX_ERROR, Run
from conventions.store.sql import make_engine
from conventions.tracing import headers as hdr
from tests.conftest import REDIS_BASE, STORE_DB
from tests.fixtures import unavailable

REDIS_URL = f"{REDIS_BASE}/{STORE_DB}"  # the store's test database, a prefix of our own
TASK = "billing.charge.v2"
#: what one finished run's record (no log lines) may take in Redis: 520 bytes measured
RECORD_BUDGET = 640


@pytest.fixture(scope="module")
def redis_backend() -> Iterator[RedisStore]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        client.close()
        unavailable(f"Redis at {REDIS_URL}", exc)
    store = RedisStore(client, prefix=f"cc-runs-{uuid.uuid4().hex}:", runs_max_logs=3)
    try:
        yield store
    finally:
        _wipe_redis(store)
        client.close()


@pytest.fixture(scope="module")
def postgresql_backend(shop_database: str) -> Iterator[SQLStore]:
    """Tables of our own (a random prefix) in the run's fresh PostgreSQL database."""
    engine = make_engine(shop_database)
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        unavailable("PostgreSQL", exc)
    store = SQLStore(engine, table_prefix=f"cc_runs_{uuid.uuid4().hex[:10]}_", runs_max_logs=3)
    try:
        yield store
    finally:
        store.metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLStore]:
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('runs') / 'store.db'}", runs_max_logs=3)
    try:
        yield store
    finally:
        store.close()


def _wipe_redis(store: RedisStore) -> None:
    for key in store.client.scan_iter(match=keys.pattern(store.prefix), count=1000):
        store.client.delete(key)


@pytest.fixture(params=["redis", "postgresql", "sqlite"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    backend = request.getfixturevalue(f"{request.param}_backend")
    try:
        yield backend
    finally:
        if isinstance(backend, RedisStore):
            _wipe_redis(backend)
        else:
            with backend.engine.begin() as conn:
                for table in backend.metadata.sorted_tables:
                    conn.execute(table.delete())


def headers(correlation: str = "c-1", key: str = "charge:1", **more: Any) -> dict[str, Any]:
    return {hdr.CORRELATION: correlation, hdr.IDEMPOTENCY_KEY: key, **more}


def step(
    store: Store,
    name: str,
    task_id: str,
    *,
    attempt: int = 0,
    minutes: float = 0,
    task: str = TASK,
    found: dict[str, Any] | None = None,
    **detail: Any,
) -> None:
    moment = datetime(2026, 1, 1, 12, tzinfo=UTC) + timedelta(minutes=minutes)
    store.add_audit(
        audit.event(name, task, task_id, found or headers(), attempt=attempt, detail=detail,
                    at=moment)
    )  # fmt: skip


def test_a_run_follows_its_events_from_queued_to_succeeded(store: Store) -> None:
    step(store, "published", "j1", found=headers(**{hdr.ACTOR: "ops:ann"}))
    first = store.get_run("j1")
    assert first is not None
    assert (first.state, first.task, first.version, first.key) == (
        "queued", TASK, "v2", "charge:1",
    )  # fmt: skip
    assert (first.correlation_id, first.actor, first.attempts) == ("c-1", "ops:ann", ())
    step(store, "started", "j1", attempt=1, minutes=1)
    assert store.get_run("j1").state == "running"  # type: ignore[union-attr]
    step(store, "succeeded", "j1", attempt=1, minutes=2, run_s=60.0)
    run = store.get_run("j1")
    assert run is not None
    assert run.state == "succeeded" and run.ended_at == run.updated_at
    assert [(a.n, a.outcome) for a in run.attempts] == [(1, "succeeded")]
    assert run.attempts[0].ended_at - run.attempts[0].started_at == timedelta(minutes=1)  # type: ignore[operator]
    assert run.created_at == datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_a_retry_then_success_is_one_run_with_two_attempts_and_a_scrubbed_error(
    store: Store,
) -> None:
    step(store, "published", "j2")
    step(store, "started", "j2", attempt=1, minutes=1)
    step(store, "retried", "j2", attempt=1, minutes=2, exc_type="HTTPError",
         reason="card 4111 1111 1111 1111 of ann@example.com declined")  # fmt: skip
    assert store.get_run("j2").state == "retrying"  # type: ignore[union-attr]
    step(store, "started", "j2", attempt=2, minutes=3)
    step(store, "succeeded", "j2", attempt=2, minutes=4)
    run = store.get_run("j2")
    assert run is not None and run.state == "succeeded"
    assert [(a.n, a.outcome) for a in run.attempts] == [(1, "retried"), (2, "succeeded")]
    error = str(run.attempts[0].error)
    assert error.startswith("HTTPError: ") and "ann@example.com" not in error
    assert "4111" not in error


def test_a_run_published_with_a_due_time_is_delayed_until_it_starts(store: Store) -> None:
    step(store, "published", "jd", due="2026-01-01T13:00:00+00:00")
    assert store.get_run("jd").state == "delayed"  # type: ignore[union-attr]
    assert [r.id for r in store.list_runs(state="delayed")] == ["jd"]
    step(store, "started", "jd", attempt=1, minutes=60)
    assert store.get_run("jd").state == "running"  # type: ignore[union-attr]
    assert store.list_runs(state="delayed") == []


def test_a_replay_says_who_replayed_it_and_which_job_it_replays(store: Store) -> None:
    step(store, "published", "jr", found=headers(**{hdr.ACTOR: "ops:ann"}))
    step(store, "replayed", "jr", actor="ops:ann", replay_of_task_id="j0", reason="fixed")
    run = store.get_run("jr")
    assert run is not None and run.state == "queued"
    assert (run.replay_of, run.replayed_by, run.actor) == ("j0", "ops:ann", "ops:ann")


def test_a_dead_letter_keeps_its_category_and_id(store: Store) -> None:
    step(store, "published", "j3")
    step(store, "started", "j3", attempt=1, minutes=1)
    step(store, "dead_lettered", "j3", attempt=1, minutes=2, category="permanent",
         dead_letter_id="dl-1", reason="400 Bad Request")  # fmt: skip
    run = store.get_run("j3")
    assert run is not None
    assert (run.state, run.category, run.dead_letter_id) == ("dead_lettered", "permanent", "dl-1")
    assert run.attempts[-1].outcome == "dead_lettered"


def test_runs_are_found_by_task_state_key_correlation_queue_and_time(store: Store) -> None:
    for i in range(6):
        found = headers(correlation=f"c-{i % 2}", key=f"charge:{i}")
        step(store, "published", f"r{i}", minutes=i, task=TASK if i < 4 else "mail.send.v1",
             found=found)  # fmt: skip
    step(store, "started", "r1", attempt=1, minutes=10, found=headers("c-1", "charge:1"))
    assert [r.id for r in store.list_runs()] == ["r5", "r4", "r3", "r2", "r1", "r0"]
    assert [r.id for r in store.list_runs(task="mail.send.v1")] == ["r5", "r4"]
    assert [r.id for r in store.list_runs(state="running")] == ["r1"]
    assert [r.id for r in store.list_runs(state="queued", task=TASK)] == ["r3", "r2", "r0"]
    assert [r.id for r in store.list_runs(key="charge:2")] == ["r2"]
    assert [r.id for r in store.list_runs(correlation_id="c-1", limit=2)] == ["r5", "r3"]
    since = datetime(2026, 1, 1, 12, 2, tzinfo=UTC)
    until = datetime(2026, 1, 1, 12, 4, tzinfo=UTC)
    assert [r.id for r in store.list_runs(since=since, until=until)] == ["r4", "r3", "r2"]
    assert store.list_runs(queue="nowhere") == []
    assert store.count_runs() == 6
    with pytest.raises(TypeError):
        store.list_runs(colour="red")


def test_the_events_that_ride_a_ledger_change_write_the_run_too(store: Store) -> None:
    store.reserve("k-ride", "j4", 60, audit=_event("published", "j4", 0))
    store.claim("k-ride", "owner", 30, "j4:0", audit=_event("started", "j4", 1))
    assert store.get_run("j4").state == "running"  # type: ignore[union-attr]
    store.complete("k-ride", "owner", "ok", 60, "j4", audit=_event("succeeded", "j4", 1))
    run = store.get_run("j4")
    assert run is not None and run.state == "succeeded" and len(run.attempts) == 1


def test_a_run_keeps_its_newest_log_lines_up_to_the_cap(store: Store) -> None:
    change = {"id": "j5", "set": {"task": TASK, "state": "running", "updated_at": 1.0},
              "once": {"created_at": 1.0}}  # fmt: skip
    for lines in (["a", "b"], ["c", "d"]):
        event = AuditEvent("started", TASK, "j5", "c-5").with_run({**change, "logs": lines})
        store.add_audit(event)
    run = store.get_run("j5")
    assert run is not None and run.logs == ("b", "c", "d")


def test_retention_purges_runs_created_before_the_cutoff(store: Store) -> None:
    step(store, "published", "old", minutes=0)
    step(store, "published", "new", minutes=60)
    assert store.purge_runs(datetime(2026, 1, 1, 12, 30, tzinfo=UTC)) == 1
    assert store.get_run("old") is None and store.get_run("new") is not None
    assert [r.id for r in store.list_runs(key="charge:1")] == ["new"]


def test_events_that_are_no_step_of_a_run_write_none(store: Store) -> None:
    step(store, "queue_paused", "x1")
    step(store, "deduplicated", "x2")
    assert store.get_run("x1") is None and store.get_run("x2") is None


def test_the_redis_store_keeps_at_most_runs_max_runs(redis_backend: RedisStore) -> None:
    redis_backend.runs_max = 3
    try:
        for i in range(5):
            step(redis_backend, "published", f"m{i}", minutes=i)
        assert [r.id for r in redis_backend.list_runs()] == ["m4", "m3", "m2"]
        assert redis_backend.list_runs(key="charge:1") == redis_backend.list_runs()
        run = redis_backend.prefix + "run:"
        client = redis_backend.client
        assert client.zcard(f"{run}lex:key") == client.zcard(f"{run}lex:correlation_id") == 3
        assert not client.exists(f"{run}rec:m0", f"{run}rec:m1")
    finally:
        redis_backend.runs_max = 100_000
        _wipe_redis(redis_backend)


def test_a_store_with_runs_off_writes_none(store: Store) -> None:
    store.runs_enabled = False  # type: ignore[attr-defined]
    try:
        step(store, "published", "off")
        assert store.get_run("off") is None
    finally:
        store.runs_enabled = True  # type: ignore[attr-defined]


def test_stuck_runs_are_past_their_time_limit_or_without_a_live_lease(store: Store) -> None:
    step(store, "published", "s1")
    step(store, "started", "s1", attempt=1, minutes=1)
    run = store.get_run("s1")
    assert run is not None
    now = datetime(2026, 1, 1, 12, 3, tzinfo=UTC)
    found = runs.stuck(store, [run], lambda task: 60.0, now=now)
    assert [(r.id, why) for r, why in found] == [("s1", "running past its time limit (60s)")]
    found = runs.stuck(store, [run], lambda task: None, now=now)
    assert [why for _, why in found] == ["its ledger lease has lapsed"]
    store.claim(keys.namespaced(TASK, "charge:1"), "owner", 30, "s1:0")
    assert runs.stuck(store, [run], lambda task: None, now=now) == []


def _event(name: str, task_id: str, attempt: int) -> AuditEvent:
    return audit.event(name, TASK, task_id, headers(key="k-ride"), attempt=attempt)


def test_the_purger_deletes_runs_past_their_own_retention(store: Store) -> None:
    step(store, "published", "ancient", minutes=0)  # 2026-01-01: long past 7 days
    fresh = audit.event("published", TASK, "fresh", headers())
    store.add_audit(fresh)
    assert retention.purge_runs(store, timedelta(days=7)) == 1
    assert store.get_run("ancient") is None and store.get_run("fresh") is not None


def test_a_publish_with_a_countdown_or_an_eta_says_when_it_is_due() -> None:
    assert audit.due_detail({}) == {} and audit.due_detail({"countdown": 0}) == {}
    eta = datetime(2026, 1, 1, 13, tzinfo=UTC)
    assert audit.due_detail({"eta": eta}) == {"due": "2026-01-01T13:00:00+00:00"}
    due = datetime.fromisoformat(audit.due_detail({"countdown": 60})["due"])
    assert timedelta(seconds=55) < due - datetime.now(UTC) <= timedelta(seconds=60)


def test_a_finished_runs_redis_record_stays_within_its_budget(redis_backend: RedisStore) -> None:
    task_id = str(uuid.uuid4())
    found = headers(correlation=uuid.uuid4().hex, key="charge:ord_0001")
    for name, attempt in (("published", 0), ("started", 1), ("succeeded", 1)):
        step(redis_backend, name, task_id, attempt=attempt, found=found)
    record = f"{redis_backend.prefix}run:rec:{task_id}"
    used = int(redis_backend.client.memory_usage(record) or 0)
    print(f"\nruns: one finished run's record takes {used} bytes (MEMORY USAGE)")
    assert 0 < used <= RECORD_BUDGET < redis_runs.RUN_BYTES


def test_a_run_keeps_its_first_attempt_and_its_newest_ones_up_to_the_cap(store: Store) -> None:
    step(store, "published", "ja")
    for n in range(1, 26):
        step(store, "started", "ja", attempt=n, minutes=n)
        step(store, "retried", "ja", attempt=n, minutes=n, exc_type="E", reason="x" * 900)
    run = store.get_run("ja")
    assert run is not None and len(run.attempts) == MAX_ATTEMPTS == 20
    assert [a.n for a in run.attempts] == [1, *range(7, 26)]
    assert all(len(str(a.error)) == MAX_ERROR for a in run.attempts)


class CountingRedis(redis.Redis):
    """A real client that counts the commands it sends (round trips: no pipelines here)."""

    sent = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.sent += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def test_run_history_adds_no_round_trip_to_a_jobs_lifecycle(redis_backend: RedisStore) -> None:
    client = CountingRedis.from_url(REDIS_URL, decode_responses=True)
    sent = {}
    try:
        for enabled in (False, True):
            store = RedisStore(client, prefix=redis_backend.prefix, runs_enabled=enabled)
            task_id, key = f"rt-{enabled}", f"k-rt-{enabled}"
            found = headers(key=key)
            steps = (("published", 0), ("started", 1), ("succeeded", 1))
            events = [audit.event(name, TASK, task_id, found, attempt=n) for name, n in steps]
            store.add_audit(audit.event("published", TASK, "warm", found))  # scripts load
            store.claim("warm", "o", 1, "warm:0")
            store.complete("warm", "o", "ok", 1, None)
            CountingRedis.sent = 0
            store.reserve(key, task_id, 60, audit=events[0])
            store.claim(key, "owner", 30, f"{task_id}:0", audit=events[1])
            store.complete(key, "owner", "ok", 60, task_id, audit=events[2])
            sent[enabled] = CountingRedis.sent
            run = store.get_run(task_id)
            assert (run is not None and run.state == "succeeded") is enabled
    finally:
        client.close()
        _wipe_redis(redis_backend)
    assert sent == {False: 3, True: 3}


#: one run's events as a fast worker and a slow publisher can deliver them, in order:
#: (event, attempt, minute, detail)
LIFE: tuple[tuple[str, int, float, dict[str, Any]], ...] = (
    ("published", 0, 0, {}),
    ("started", 1, 1, {}),
    ("retried", 1, 2, {"exc_type": "HTTPError", "reason": "503"}),
    ("started", 2, 3, {}),
    ("succeeded", 2, 4, {}),
)


def _play(store: Store, task_id: str, order: tuple[int, ...]) -> None:
    for index in order:
        name, attempt, minute, detail = LIFE[index]
        step(store, name, task_id, attempt=attempt, minutes=minute, **detail)


def test_a_published_event_written_after_the_worker_finished_leaves_the_run_succeeded(
    store: Store,
) -> None:
    """The two-step publish: the push, then ``published``; a fast worker's ``started``
    and ``succeeded`` can land first. The late event must not move the run back."""
    step(store, "started", "late", attempt=1, minutes=1)
    step(store, "succeeded", "late", attempt=1, minutes=2)
    step(store, "published", "late", minutes=0)
    run = store.get_run("late")
    assert run is not None
    assert (run.state, run.live) == ("succeeded", False)
    assert run.ended_at == run.updated_at == datetime(2026, 1, 1, 12, 2, tzinfo=UTC)
    assert run.created_at == datetime(2026, 1, 1, 12, tzinfo=UTC)  # when it was queued
    assert [r.id for r in store.list_runs(state="queued")] == []


def test_a_retry_event_written_after_the_next_attempt_started_leaves_it_running(
    store: Store,
) -> None:
    step(store, "published", "jt")
    step(store, "started", "jt", attempt=1, minutes=1)
    step(store, "started", "jt", attempt=2, minutes=3)  # the retry was pushed, then ...
    step(store, "retried", "jt", attempt=1, minutes=2, exc_type="E", reason="x")  # ... said
    run = store.get_run("jt")
    assert run is not None and run.state == "running"
    assert [(a.n, a.outcome) for a in run.attempts] == [(1, "retried"), (2, None)]
    assert run.worker is None and run.attempts[-1].started_at is not None


@pytest.mark.parametrize("order", [(4, 3, 2, 1, 0), (1, 2, 3, 4, 0), (0, 3, 4, 1, 2)])
def test_a_runs_record_is_the_same_whatever_order_its_events_land_in(
    store: Store, order: tuple[int, ...]
) -> None:
    _play(store, "inorder", tuple(range(len(LIFE))))
    _play(store, "shuffled", order)
    expected, found = store.get_run("inorder"), store.get_run("shuffled")
    assert expected is not None and found is not None
    assert expected.state == "succeeded"
    assert {**found.to_dict(), "id": "inorder"} == expected.to_dict()


def test_the_redis_script_merges_every_order_of_events_as_the_python_rules_do(
    redis_backend: RedisStore,
) -> None:
    """One source, two implementations: the Lua merge is checked against
    :func:`conventions.store.runs.merge` on every order of a run's five events."""
    try:
        for number, order in enumerate(itertools.permutations(range(len(LIFE)))):
            task_id = f"perm-{number}"
            _play(redis_backend, task_id, order)
            doc: dict[str, Any] | None = None
            for index in order:
                name, attempt, minute, detail = LIFE[index]
                moment = datetime(2026, 1, 1, 12, tzinfo=UTC) + timedelta(minutes=minute)
                event = audit.event(name, TASK, task_id, headers(), attempt=attempt,
                                    detail=detail, at=moment)  # fmt: skip
                assert event.run is not None
                doc = runs_store.merge(doc, event.run, max_logs=redis_backend.runs_max_logs)
            assert doc is not None
            raw = redis_backend.client.get(f"{redis_backend.prefix}run:rec:{task_id}")
            assert Run.from_doc(json.loads(str(raw))) == Run.from_doc(doc), order
    finally:
        _wipe_redis(redis_backend)


def _index_entries(store: RedisStore, task_id: str) -> set[tuple[str, str, float]]:
    """Every run index entry that names ``task_id``: (index, member, score)."""
    client, found = store.client, set()
    for index in client.scan_iter(match=f"{store.prefix}run:*", count=1000):
        if ":rec:" in index:
            continue
        for member, score in client.zrange(index, 0, -1, withscores=True):
            if member == task_id or member.endswith(f"\0{task_id}"):
                found.add((index, member, score))
    return found


def test_the_redis_indexes_follow_the_record_whatever_order_its_events_land_in(
    redis_backend: RedisStore,
) -> None:
    """Each event moves only the index entries whose field moved (its state, or every
    scored entry when an earlier event moves ``created_at``): on every order of a run's
    five events, the entries left are those of the final record, and no other."""
    pre = f"{redis_backend.prefix}run:"
    try:
        for number, order in enumerate(itertools.permutations(range(len(LIFE)))):
            task_id = f"ix-{number}"
            _play(redis_backend, task_id, order)
            raw = redis_backend.client.get(f"{pre}rec:{task_id}")
            doc = json.loads(str(raw))
            created = float(doc["created_at"])
            expected = {(f"{pre}all", task_id, created), (f"{pre}ix:task:{TASK}", task_id, created)}
            if doc["state"] not in redis_runs.UNINDEXED_STATES:
                expected.add((f"{pre}ix:state:{doc['state']}", task_id, created))
            if doc.get("queue"):
                expected.add((f"{pre}ix:queue:{doc['queue']}", task_id, created))
            for name in ("key", "correlation_id"):
                expected.add((f"{pre}lex:{name}", f"{doc[name]}\0{task_id}", 0.0))
            assert _index_entries(redis_backend, task_id) == expected, order
    finally:
        _wipe_redis(redis_backend)

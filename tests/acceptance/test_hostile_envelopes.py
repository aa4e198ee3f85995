"""Hostile envelopes: entries any producer can push into a queue's list, against a real
``celery worker`` subprocess on the layer's transport.

Every field of kombu's envelope is fuzzed (missing, wrong type, huge, wrong encoding)
from a fixed seed, printed so that a failure can be replayed (``HOSTILE_SEED``). Each
entry must end as exactly one dead letter with its reason, or run when it is still a
valid message; the worker must keep consuming (a good job after the junk succeeds) and
nothing may stay in the unacked set or an inbox.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from conventions.store.records import Category, DeadLetter
from conventions.transport import redis as broker
from conventions.transport.envelope import MAX_ENTRY
from tests.fixtures import WorkerProcess
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.usefixtures("clean_store")

SEED = int(os.environ.get("HOSTILE_SEED", "20"))
QUEUE = "email"
TASK = "testing.echo.v1"
#: a short visibility timeout and restore sweep: a leaked record would come back fast
WORKER_ENV = {"CONVENTIONS_VISIBILITY_TIMEOUT": "20", "CONVENTIONS_UNACKED_RESTORE_INTERVAL": "2"}
RUNS = "runs"
DROP = object()  # the field is left out


def envelope(marker: str, body: Any = None, **headers: Any) -> dict[str, Any]:
    """A kombu envelope of a Celery protocol 2 message as kombu's Redis transport writes
    it; ``marker`` is its task id and ``call_id`` and leads the entry (found in any head)."""
    if body is None:
        body = [[], {"call_id": marker}, {"callbacks": None, "errbacks": None, "chain": None}]
    return {
        "x-case": marker,
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": TASK, "id": marker, "root_id": marker, "parent_id": None,
            "group": None, "retries": 0, "eta": None, "expires": None,
            "timelimit": [None, None], "argsrepr": "()", "kwargsrepr": "{}", "origin": "hostile",
            **headers,
        },
        "properties": {
            "correlation_id": marker, "reply_to": "", "delivery_mode": 2, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": QUEUE, "routing_key": QUEUE},
        },
    }  # fmt: skip


def mutate(entry: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``entry`` with the field at ``path`` (dotted) set to ``value``, or left out."""
    *parents, leaf = path.split(".")
    node = entry
    for name in parents:
        node = node[name]
    if value is DROP:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return entry


@dataclass
class Case:
    name: str
    marker: str
    raw: bytes
    #: ``RUNS``, or (category, a fragment of the dead letter's reason)
    expected: Any


def _junk(rng: random.Random, size: int) -> str:
    return "".join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789 {}[]",:') for _ in range(size))


def fuzz_cases(rng: random.Random) -> list[Case]:  # noqa: PLR0915
    """Every envelope field: missing, of each wrong type, huge, wrongly encoded."""
    cases: list[Case] = []
    malformed = (Category.UNPARSEABLE, "malformed envelope")
    too_big = (Category.INVALID, "over the cap")

    def add(name: str, build: Callable[[str], bytes | dict[str, Any]], expected: Any) -> None:
        marker = f"hz-{len(cases):02d}"
        built = build(marker)
        raw = built if isinstance(built, bytes) else json.dumps(built).encode()
        if len(raw) > MAX_ENTRY:  # weighed before anything else
            expected = too_big
        cases.append(Case(name, marker, raw, expected))

    def field(path: str, value: Any, expected: Any, name: str = "") -> None:
        label = name or f"{path}={'missing' if value is DROP else type(value).__name__}"
        add(label, lambda m: mutate(envelope(m), path, value), expected)

    wrong_types: list[Any] = [
        [rng.randint(0, 9)], _junk(rng, rng.randint(1, 40)), rng.randint(-(10**6), 10**6),
        rng.random(), True, None, {"x": _junk(rng, 5)},
    ]  # fmt: skip
    not_kombu = (Category.UNPARSEABLE, "not a kombu message")
    # the entry itself
    add("not JSON", lambda m: f'{{"x-case": "{m}", '.encode() + b"\xff\xfe", not_kombu)
    add("JSON list", lambda m: json.dumps([m, 1, 2]).encode(), not_kombu)
    add("JSON string", lambda m: json.dumps(m).encode(), not_kombu)
    add("JSON number", lambda m: str(rng.randint(1, 10**9)).encode() + b" " + m.encode(), not_kombu)
    add("empty object", lambda m: json.dumps({"x-case": m}).encode(), malformed)
    # the six kinds of issue 20, item 1
    field("headers", ["task", TASK], malformed, "headers as a list")
    field("headers", f"task={TASK}", malformed, "headers as a string")
    field("properties.body_encoding", "rot13", malformed, "unknown body_encoding")
    field("body", "%%% not base64 %", malformed, "body not valid base64")
    field("body", rng.randint(1, 10**6), malformed, "numeric body")
    field("properties.delivery_tag", [str(uuid.uuid4())], malformed, "delivery tag as a list")
    # every envelope field of every wrong type
    for path in ("properties", "properties.delivery_tag", "properties.delivery_info",
                 "properties.body_encoding", "body", "headers"):  # fmt: skip
        for value in wrong_types:
            if path == "properties.body_encoding" and value is None:
                continue  # no encoding: the base64 text is the body (below)
            if value is None and path in ("headers", "properties.body_encoding"):
                continue  # no headers, no body encoding: below
            if isinstance(value, str) and path == "body":
                continue  # junk may still be base64: the fixed cases above and below
            expected: Any = malformed
            if isinstance(value, str) and path == "properties.delivery_tag":
                expected = RUNS  # any string is a tag
            if isinstance(value, dict) and path == "headers":
                expected = (Category.UNPARSEABLE, "not a Celery task message")
            field(path, value, expected)
    for path in ("properties.delivery_info.exchange", "properties.delivery_info.routing_key",
                 "content-type", "content-encoding"):  # fmt: skip
        field(path, [rng.randint(0, 9)], malformed)
        field(path, rng.randint(0, 10**6), malformed)
    # missing fields
    for path in (
        "properties",
        "properties.delivery_tag",
        "properties.delivery_info",
        "body",
        "properties.delivery_info.exchange",
        "properties.delivery_info.routing_key",
    ):
        field(path, DROP, malformed)
    field("headers", DROP, (Category.UNPARSEABLE, "not a Celery task message"))
    field("headers", None, (Category.UNPARSEABLE, "not a Celery task message"))
    # no content type: kombu hands the raw bytes over, which are not [args, kwargs, embed]
    field("content-type", DROP, (Category.UNPARSEABLE, "malformed task message"))
    field("content-encoding", DROP, RUNS)
    field("properties.body_encoding", DROP, (Category.UNPARSEABLE, "cannot decode the body"))
    field("properties.priority", DROP, RUNS)
    field("properties.priority", "high", RUNS)
    # wrong encodings
    field(
        "body",
        base64.b64encode(b"\x80\x81 not json").decode(),
        (Category.UNPARSEABLE, "cannot decode the body"),
        "body: base64 of binary junk",
    )
    field(
        "content-type",
        "application/x-python-serialize",
        (Category.INVALID, "refused task message"),
        "content-type: pickle",
    )
    field(
        "properties.body_encoding",
        "utf-8",
        (Category.UNPARSEABLE, "cannot decode the body"),
        "body_encoding utf-8, base64 body",
    )
    # huge fields
    huge = rng.randint(1, 3) * 1024 * 1024
    field("properties.delivery_tag", "t" * huge, malformed, "huge delivery tag")
    field("headers.x-junk", _junk(rng, 64) * (huge // 64), too_big, "huge foreign header")
    add("huge body", lambda m: envelope(m, [[], {"call_id": m, "blob": "x" * huge}, {}]), too_big)
    large = rng.randint(64, 512) * 1024  # under the message cap: the runner refuses it
    add("large body", lambda m: envelope(m, [[], {"call_id": m, "blob": "x" * large}, {}]),
        (Category.INVALID, "blob"))  # fmt: skip
    add("huge entry of junk", lambda m: f"{m} ".encode() + os.urandom(huge), not_kombu)
    # Celery's own headers with the wrong types
    field("headers.task", rng.randint(0, 99), (Category.INVALID, "unknown task"))
    field("headers.id", [rng.randint(0, 9)], (Category.UNPARSEABLE, "malformed task message"))
    field("headers.eta", _junk(rng, 12), (Category.INVALID, "refused task message"))
    rng.shuffle(cases)
    return cases


def _records_of(records: list[DeadLetter], marker: str) -> list[DeadLetter]:
    """The dead letters that name ``marker`` anywhere, in a binary raw entry too."""
    needle = re.compile(re.escape(marker) + r"(?!\d)")
    found = []
    for record in records:
        text = json.dumps(record.to_dict())
        if "raw_body_base64" in record.payload:
            text += base64.b64decode(record.payload["raw_body_base64"]).decode("latin-1")
        if needle.search(text):
            found.append(record)
    return found


def _left_over(client: redis.Redis) -> dict[str, int]:
    return {
        "unacked": int(client.hlen("unacked")),
        "unacked_index": int(client.zcard("unacked_index")),
        "inboxes": broker.in_inboxes(client),
        "queue": int(client.llen(QUEUE)),
    }


def _good_job_runs(call_id: str) -> None:
    from tests.integration import support_jobs

    assert support_jobs.echo.delay(call_id=call_id).get(timeout=60)["call_id"] == call_id


@pytest.mark.timeout(300)
def test_every_fuzzed_envelope_becomes_one_dead_letter_and_the_worker_keeps_consuming(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    from tasks import app

    print(f"hostile envelope fuzz: seed {SEED} (HOSTILE_SEED={SEED} replays it)")
    cases = fuzz_cases(random.Random(SEED))
    worker = worker_process("hostile", QUEUE, concurrency=1, **WORKER_ENV)
    for case in cases:
        broker_redis.lpush(QUEUE, case.raw)
    dead = sum(1 for case in cases if case.expected != RUNS)

    def settled() -> bool:
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.output()[-6000:]}"
        return app.store.count_dead_letters() >= dead and not any(_left_over(broker_redis).values())

    try:
        wait_for(settled, timeout=120)
    except AssertionError:
        raise AssertionError(
            f"not settled: {_left_over(broker_redis)}\n{worker.output()[-6000:]}"
        ) from None
    _good_job_runs("after-junk")
    records = app.store.list_dead_letters(limit=1000)
    wrong = {}
    for case in cases:
        found = _records_of(records, case.marker)
        if case.expected == RUNS:
            state = app.AsyncResult(case.marker).state
            if found or state != "SUCCESS":
                wrong[case.name] = (state, [r.message for r in found])
            continue
        category, reason = case.expected
        outcome = [(r.category, r.message) for r in found]
        if len(found) != 1 or found[0].category is not category or reason not in found[0].message:
            wrong[case.name] = outcome
    assert not wrong, wrong
    assert len(records) == dead
    # the good job's ack follows its result: wait for it
    wait_for(lambda: not any(_left_over(broker_redis).values()), timeout=30)
    assert worker.proc.poll() is None
    assert "Unrecoverable error" not in worker.output()


def test_a_malformed_entry_keeps_the_raw_entry_scrubbed_and_capped(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    from tasks import app

    entry = envelope("hz-raw")
    entry["headers"] = ["ann@example.com", "x" * 100_000]
    raw = json.dumps(entry).encode()
    worker_process("hostile", QUEUE, concurrency=1, **WORKER_ENV)
    broker_redis.lpush(QUEUE, raw)
    record = wait_for(lambda: next(iter(app.store.list_dead_letters(limit=10)), None))
    assert record.category is Category.UNPARSEABLE
    assert "headers" in record.message
    kept = record.payload
    assert kept["size"] == len(raw) and kept["truncated"] is True
    assert kept["sha256"] == __import__("hashlib").sha256(raw).hexdigest()
    assert kept["raw_body"].startswith('{"x-case": "hz-raw"')
    assert "ann@example.com" not in kept["raw_body"]
    assert len(kept["raw_body"]) <= kept["kept_bytes"]
    _good_job_runs("after-raw")
    wait_for(lambda: not any(_left_over(broker_redis).values()), timeout=30)


def test_a_raw_eta_far_ahead_waits_in_the_delayed_set_not_in_a_worker(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    """A foreign producer's message pushed straight into the queue with an ETA an hour
    ahead: the worker's fetch puts it in the delayed set (the layer's transport), where
    it waits for its time; no worker holds it, nothing is dead-lettered."""
    from tasks import app

    eta = datetime.now(UTC) + timedelta(hours=1)
    worker_process("hostile", QUEUE, concurrency=1, **WORKER_ENV)
    broker_redis.lpush(QUEUE, json.dumps(envelope("hz-eta", eta=eta.isoformat())))
    delayed = f"_cc.delayed.{QUEUE}"
    wait_for(lambda: broker_redis.zcard(delayed) == 1)
    ((member, due),) = broker_redis.zrange(delayed, 0, 0, withscores=True)
    assert abs(due - eta.timestamp()) < 1 and '"hz-eta"' in member
    wait_for(lambda: not any(_left_over(broker_redis).values()), timeout=30)
    assert app.store.count_dead_letters() == 0 and broker_redis.llen(QUEUE) == 0
    broker_redis.delete(delayed)
    _good_job_runs("after-eta")


@pytest.mark.timeout(180)
def test_two_messages_sharing_a_delivery_tag_each_keep_their_record_through_kill_nine(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    """A producer chooses the delivery tag: two messages in flight with the same one must
    not share one in-flight record. The held job's message stays recorded once the echo
    with its tag is acked, so after a kill -9 of its worker it runs again."""
    from tasks import app
    from tests.acceptance.support_hostile import HELD_RUNS, RELEASE

    include = "tests.integration.support_jobs,tests.acceptance.support_hostile"
    env = {"CONVENTIONS_RECOVERY_TIMEOUT": "3"}
    tag = str(uuid.uuid4())
    held, echo = envelope("hz-held", task="testing.held.v1"), envelope("hz-echo")
    held["properties"]["delivery_tag"] = echo["properties"]["delivery_tag"] = tag
    first = worker_process("tag-first", QUEUE, concurrency=2, include=include, **env)
    broker_redis.lpush(QUEUE, json.dumps(held))
    wait_for(lambda: app.store.client.get(HELD_RUNS + "hz-held") == "1")
    broker_redis.lpush(QUEUE, json.dumps(echo))
    assert app.AsyncResult("hz-echo").get(timeout=60)["call_id"] == "hz-echo"

    def echo_acked() -> bool:
        return not any("hz-echo" in raw for raw in broker_redis.hvals("unacked"))

    wait_for(echo_acked)
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    app.store.client.set(RELEASE + "hz-held", 1)
    worker_process("tag-second", QUEUE, concurrency=2, include=include, **env)
    try:
        assert app.AsyncResult("hz-held").get(timeout=60) == "hz-held"
    finally:
        app.store.client.delete(RELEASE + "hz-held")
    assert app.store.client.get(HELD_RUNS + "hz-held") == "2"
    run = wait_for(lambda: (r := app.store.get_run("hz-held")) and r.state != "running" and r)
    assert run.state == "succeeded"
    assert app.store.count_dead_letters() == 0
    wait_for(lambda: not any(_left_over(broker_redis).values()), timeout=30)


#: a fake log line of the worker's and a colour, under the headers' 256 characters
FORGED_LINE = "[2026-12-02 04:00:00,000: CRITICAL/MainProcess] forged"


def test_forged_headers_and_a_key_with_control_characters_are_escaped_in_the_text_log(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    """``cc_correlation`` and ``cc_actor`` with a newline and ANSI escapes, and a payload
    whose key holds a newline and NUL: the worker's text log shows them escaped, on the
    line they belong to; no forged line, no raw escape reaches the log."""
    from tasks import app

    include = "tests.integration.support_jobs,tests.acceptance.support_hostile"
    forged = f"corr\n{FORGED_LINE}\x1b[31m"
    body = [[], {"text": "line\none\x00two"}, {"callbacks": None, "errbacks": None,
                                               "chain": None}]  # fmt: skip
    entry = envelope("hz-noted", body, task="testing.noted.v1",
                     cc_correlation=forged, cc_actor=f"ops\n{FORGED_LINE}\x1b[0m")  # fmt: skip
    worker = worker_process("forged", QUEUE, concurrency=1, include=include,
                            CONVENTIONS_LOG_FORMAT="text")  # fmt: skip
    broker_redis.lpush(QUEUE, json.dumps(entry))
    assert app.AsyncResult("hz-noted").get(timeout=60) == "noted:line\none\x00two"
    log = wait_for(lambda: "noted under" in (out := worker.output()) and out)
    noted = next(line for line in log.splitlines() if "noted under" in line)
    assert "noted under noted:line\\none\\x00two" in noted
    assert "corr=corr\\n[2026-12-02 04:00:00,000: CRITICAL/MainProcess] forged\\x1b[31m" in noted
    assert "key=noted:line\\none\\x00two" in noted
    assert not [line for line in log.splitlines() if line.startswith(FORGED_LINE[:24])]
    assert "\x1b" not in log and "\x00" not in log


def _over_the_caps() -> dict[str, bytes]:
    """Envelopes over the caps the first round missed (a few MB: the raw size is what
    is weighed), each with its marker."""
    keys = envelope("hz-keys")
    keys["headers"].update({f"k{i:07d}-{'x' * 40}": 1 for i in range(50_000)})  # 2.6 MB
    one_key = envelope("hz-one-key")
    one_key["headers"]["k" * (2 * 1024 * 1024)] = "v"
    reply_to = envelope("hz-reply-to")
    reply_to["properties"]["reply_to"] = "r" * (2 * 1024 * 1024)
    many = envelope("hz-many-headers")  # small, but more headers than the cap
    many["headers"].update({f"h{i}": i for i in range(300)})
    return {
        marker: json.dumps(entry).encode()
        for marker, entry in (("hz-keys", keys), ("hz-one-key", one_key),
                              ("hz-reply-to", reply_to), ("hz-many-headers", many))
    }  # fmt: skip


@pytest.mark.timeout(180)
def test_an_envelope_over_the_size_or_header_cap_is_dead_lettered_whole_before_decoding(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    """Megabytes of header keys, one huge header key, a huge ``reply_to``, 300 headers:
    weighed as read from the broker, each is one ``invalid`` dead letter that keeps the
    entry's size, digest and a bounded head, and none of them runs."""
    from conventions.observability.deadletters import MAX_RAW_BODY
    from tasks import app

    entries = _over_the_caps()
    worker = worker_process("caps", QUEUE, concurrency=1, **WORKER_ENV)
    for raw in entries.values():
        broker_redis.lpush(QUEUE, raw)
    wait_for(lambda: app.store.count_dead_letters() >= len(entries), timeout=60)
    records = app.store.list_dead_letters(limit=100)
    for marker, raw in entries.items():
        (record,) = _records_of(records, marker)
        cap = "headers, over the cap of 256" if "many" in marker else "bytes as read"
        assert record.category is Category.INVALID and cap in record.message, record.message
        assert record.payload["size"] == len(raw)
        assert record.payload["sha256"] == __import__("hashlib").sha256(raw).hexdigest()
        assert record.payload["kept_bytes"] <= MAX_RAW_BODY
        assert len(json.dumps(record.to_dict())) < 4 * MAX_RAW_BODY
        assert app.AsyncResult(marker).state != "SUCCESS"
    _good_job_runs("after-caps")
    wait_for(lambda: not any(_left_over(broker_redis).values()), timeout=30)
    assert worker.proc.poll() is None


def _memory(pid: int) -> tuple[int, int]:
    """(resident, peak resident) MB of a process, from /proc."""
    with open(f"/proc/{pid}/status") as file:
        status = dict(line.split(":", 1) for line in file.read().splitlines())
    return int(status["VmRSS"].split()[0]) // 1024, int(status["VmHWM"].split()[0]) // 1024


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_113_mb_envelope_of_a_million_header_keys_never_reaches_the_pool(
    worker_process: Callable[..., WorkerProcess], broker_redis: redis.Redis
) -> None:
    """The first round's 113 MB message (a million header keys): one ``invalid`` dead
    letter, the pool child never sees it; the worker's memory is printed, before and
    after (resident and peak, main process and pool child)."""
    from tasks import app

    entry = envelope("hz-113mb")
    entry["headers"].update({f"k{i:07d}-{'x' * 96}": 1 for i in range(1_000_000)})
    raw = json.dumps(entry).encode()
    del entry
    worker = worker_process("big", QUEUE, concurrency=1, **WORKER_ENV)
    main = worker.proc.pid
    with open(f"/proc/{main}/task/{main}/children") as file:
        (child,) = map(int, file.read().split())
    before = {"main": _memory(main), "child": _memory(child)}
    broker_redis.lpush(QUEUE, raw)
    size = len(raw)
    del raw
    wait_for(
        lambda: app.store.count_dead_letters() or app.AsyncResult("hz-113mb").state == "SUCCESS",
        timeout=300,
    )
    after = {"main": _memory(main), "child": _memory(child)}
    print(f"\n113 MB envelope ({size} bytes): rss/peak MB before {before}, after {after}")
    (record,) = app.store.list_dead_letters(limit=10)
    assert record.category is Category.INVALID and "as read from the broker" in record.message
    assert after["child"][1] < before["child"][1] + 50, (before, after)
    _good_job_runs("after-113mb")

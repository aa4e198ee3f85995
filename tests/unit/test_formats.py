"""The table of format versions and the checks readers make with it: a newer version is
refused with a message that says what to do, an older or absent one is read as always,
and writers at version 1 write nothing more than before (no per-job cost)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from conventions.config import formats
from conventions.errors import NewerFormat
from conventions.store import runs
from conventions.store.records import AuditEvent, Category, DeadLetter
from conventions.tracing import headers as hdr
from conventions.transport import layout

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _dead_letter() -> DeadLetter:
    return DeadLetter(
        id="dl1", task="email.send_receipt.v1", task_id="t1", category=Category.BUG,
        payload={"order_id": "o1"}, headers={}, idempotency_key="receipt:o1",
        exc_type="KeyError", message="m", traceback="", attempts=1,
        first_failed_at=NOW, last_failed_at=NOW, worker="w1",
    )  # fmt: skip


def _event() -> AuditEvent:
    return AuditEvent("started", "email.send_receipt.v1", "t1", "c1", attempt=1, at=NOW)


# -- the table ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(formats.READS_FROM))
def test_every_format_reads_from_a_version_no_newer_than_it_writes(name: str) -> None:
    assert 1 <= formats.READS_FROM[name] <= formats.current(name)
    assert name in formats.WHAT


def test_the_format_header_is_one_of_ours_and_read_as_a_version() -> None:
    assert hdr.FORMAT == "cc_format" and hdr.FORMAT in hdr.ALL_HEADERS
    assert hdr.read_header(hdr.FORMAT, 3) == 3
    assert hdr.read_header(hdr.FORMAT, "3") == 3
    for junk in (0, -1, True, "x", 10**9, [2], "2\n"):
        assert hdr.read_header(hdr.FORMAT, junk, warn=False) is None


# -- messages ------------------------------------------------------------------------------
def test_a_message_of_this_format_an_older_one_or_none_is_read() -> None:
    for headers in ({}, {hdr.FORMAT: formats.HEADERS}, {hdr.FORMAT: 1}, {hdr.FORMAT: "junk"}):
        assert formats.message_refusal(headers) is None


def test_a_newer_message_format_is_refused_naming_both_versions_and_the_fix() -> None:
    newer = formats.HEADERS + 1
    reason = formats.message_refusal({hdr.FORMAT: newer})
    assert reason == (
        f"message format version {newer} was written by a newer release (this worker "
        f"reads up to {formats.HEADERS}): replay once the fleet runs the new release"
    )


def test_the_check_reads_the_version_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "HEADERS", 2)
    assert formats.message_refusal({hdr.FORMAT: 2}) is None
    assert formats.message_refusal({hdr.FORMAT: 3}) is not None


# -- records -------------------------------------------------------------------------------
def test_records_of_version_1_are_written_exactly_as_before() -> None:
    assert formats.RECORD_FIELD not in _dead_letter().to_dict()
    assert formats.RECORD_FIELD not in _event().to_dict()
    assert formats.RECORD_FIELD not in _event().to_compact()
    patch = runs.patch("started", "t", "t1", NOW, 1, detail={}, once={})
    assert patch is not None and formats.RECORD_FIELD not in patch["set"]


def test_a_record_without_v_or_with_v_1_reads_as_before() -> None:
    data = _dead_letter().to_dict()
    assert DeadLetter.from_dict(data) == _dead_letter()
    assert DeadLetter.from_dict({**data, "v": 1}) == _dead_letter()
    assert AuditEvent.from_compact({**_event().to_compact(), "v": 1}, "c1") == _event()


def _newer_copies(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str, str]:
    """The JSON of each record as a release writing records version 2 writes it."""
    monkeypatch.setattr(formats, "RECORDS", 2)
    doc = runs.merge(
        None, runs.patch("started", "t", "t1", NOW, 1, detail={}, once={}) or {}, max_logs=0
    )
    copies = (
        json.dumps(_dead_letter().to_dict()),
        json.dumps(_event().to_dict()),
        json.dumps(_event().to_compact()),
        json.dumps(doc),
    )
    monkeypatch.setattr(formats, "RECORDS", 1)
    return copies


def test_every_record_written_by_a_newer_release_is_refused_never_misread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead, event, compact, run = _newer_copies(monkeypatch)
    readers = [
        ("dead letter", lambda: DeadLetter.from_dict(json.loads(dead))),
        ("audit event", lambda: AuditEvent.from_dict(json.loads(event))),
        ("audit event", lambda: AuditEvent.from_compact(json.loads(compact), "c1")),
        ("run record", lambda: runs.Run.from_doc(json.loads(run))),
    ]
    for what, read in readers:
        with pytest.raises(NewerFormat, match=f"^{what} written by a newer release") as caught:
            read()
        assert "(record version 2; this one reads up to 1): upgrade this process" in str(
            caught.value
        )
        assert (caught.value.name, caught.value.found, caught.value.reads) == ("records", 2, 1)


def test_a_newer_release_reads_its_own_records(monkeypatch: pytest.MonkeyPatch) -> None:
    dead, _, compact, run = _newer_copies(monkeypatch)
    monkeypatch.setattr(formats, "RECORDS", 2)
    assert DeadLetter.from_dict(json.loads(dead)) == _dead_letter()
    assert AuditEvent.from_compact(json.loads(compact), "c1") == _event()
    assert runs.Run.from_doc(json.loads(run)).id == "t1"


def test_an_older_writers_merge_keeps_a_newer_runs_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, _, run = _newer_copies(monkeypatch)
    change = runs.patch("succeeded", "t", "t1", NOW, 1, detail={}, once={})
    assert change is not None
    assert runs.merge(json.loads(run), change, max_logs=0)["v"] == 2


# -- outbox rows ---------------------------------------------------------------------------
def test_an_outbox_row_of_a_newer_release_is_left_for_a_newer_relay() -> None:
    assert formats.row_problem({}) is None
    assert formats.row_problem(None) is None
    assert formats.row_problem({formats.ROW_FIELD: formats.OUTBOX_ROW}) is None
    problem = formats.row_problem({formats.ROW_FIELD: formats.OUTBOX_ROW + 1})
    assert problem is not None
    assert str(problem).startswith("outbox row written by a newer release")
    assert "left for a relay of the new release" in str(problem)


# -- store stamps (the ``migrate`` command reads and writes them) ------------------------
@pytest.mark.parametrize("name", ["transport_layout", "store_redis", "store_sql"])
def test_a_stamp_this_release_reads_is_no_problem(name: str) -> None:
    assert formats.stamp_problem(name, None) is None  # a store from before stamps: 1
    assert formats.stamp_problem(name, formats.current(name)) is None


def test_a_newer_stamp_says_upgrade_this_process() -> None:
    problem = formats.stamp_problem("store_redis", formats.STORE_REDIS + 1)
    assert problem is not None
    assert f"Redis store layout is version {formats.STORE_REDIS + 1}" in problem
    assert "written by a newer release" in problem and "upgrade this process" in problem


def test_an_older_stamp_than_read_says_run_migrate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "STORE_SQL", 3)
    monkeypatch.setitem(formats.READS_FROM, "store_sql", 2)
    problem = formats.stamp_problem("store_sql", 1)
    assert problem is not None
    assert "older than this release reads (from 2)" in problem
    assert "`conventions migrate --apply`" in problem
    assert formats.stamp_problem("store_sql", 2) is None


def test_the_problems_of_a_stores_stamps_are_listed_in_order() -> None:
    stamps = {"transport_layout": 1, "store_redis": formats.STORE_REDIS + 1, "store_sql": None}
    [problem] = formats.stamp_problems(stamps)
    assert problem.startswith("the Redis store layout is version")


# -- layouts this version promises (mixed fleets read them the same) ----------------------
#: the transport's keys at ``TRANSPORT_LAYOUT`` 1: every worker of that layout, of any
#: release, reads another's liveness and in-flight sets through exactly these names
LAYOUT_1 = {
    "DELAYED": "_cc.delayed.{queue}",
    "CONSUMERS": "_cc.consumers",
    "CONSUMER": "_cc.consumer.{consumer}",
    "DEAD_SINCE": "_cc.consumers.dead",
    "INBOXES": "_cc.inboxes",
    "INBOX": "_cc.inbox.{consumer}:{source}",
    "BELL": "_cc.bell.{queue}",
    "PRIORITY_SEP": "\x06\x16",
}


def test_the_transport_layout_is_the_one_its_version_promises() -> None:
    """Changing a key the fleet shares without a new ``TRANSPORT_LAYOUT`` would make an
    older worker miss a newer one's liveness or in-flight set: bump the version (and
    give ``conventions migrate`` its step), then add the new layout here."""
    assert formats.TRANSPORT_LAYOUT == 1
    assert {name: getattr(layout, name) for name in LAYOUT_1} == LAYOUT_1

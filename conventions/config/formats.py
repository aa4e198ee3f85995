"""The version of every wire and storage format the layer writes, in one table.

A reader checks the version of what it meets: the version it writes and every older one
down to ``READS_FROM`` it reads; a newer one it refuses loudly (a dead letter with the
reason, or a doctor error), never misreads. A format's version moves only when its shape
changes in a way an older reader would misread (docs/reference/compatibility.md).

Where each version is carried, and what checking it costs:

* ``HEADERS``: the ``cc_format`` header of every message a process of the layer
  publishes (set by the publish hook: one dictionary write per publish); the worker's
  consumer reads it before Celery sees the message (one dictionary read per message)
  and dead-letters a newer one as ``newer_format`` (:func:`message_refusal`).
* ``RECORDS``: a ``v`` field inside each JSON record the stores keep (dead letter, audit
  event, run record), absent at version 1, so that today's writers write nothing more;
  checked by the code that already parses the record (:func:`check_record`).
* ``OUTBOX_ROW``: a ``_cc_row`` key inside the row's ``headers`` JSON, absent at
  version 1; the relay checks it and leaves a newer row to a newer relay.
* ``TRANSPORT_LAYOUT``, ``STORE_REDIS``, ``STORE_SQL``: one stamp per store, read once
  when a worker or the doctor starts (``conventions migrate`` keeps it); a job's path
  never reads it. :func:`stamp_problem` says what a stamp means for this release.

Readers read the versions through this module's attributes at call time (``formats.HEADERS``,
never a copied name), so a test can play a newer release by setting one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final

from conventions.errors import NewerFormat

#: the message headers the layer writes (``cc_*``) and the payload envelope around them
HEADERS: Final = 1
#: the transport's Redis key layout (``conventions.transport.layout``)
TRANSPORT_LAYOUT: Final = 1
#: the store's record shapes on Redis (ledger, reservations, runs, audit, dead letters)
STORE_REDIS: Final = 1
#: the SQL store's schema (tables and columns; ``conventions migrate`` moves it)
STORE_SQL: Final = 1
#: the transactional outbox's row
OUTBOX_ROW: Final = 1
#: the JSON body of each record either store keeps (dead letter, audit event, run
#: record): its ``v`` field, absent at version 1
RECORDS: Final = 1

#: the oldest version of each format this release still reads (one minor version back)
READS_FROM: Final = {
    "headers": 1,
    "transport_layout": 1,
    "store_redis": 1,
    "store_sql": 1,
    "outbox_row": 1,
    "records": 1,
}

#: what each format is, for the messages below
WHAT: Final = {
    "headers": "message format",
    "transport_layout": "Redis transport key layout",
    "store_redis": "Redis store layout",
    "store_sql": "SQL store schema",
    "outbox_row": "outbox row",
    "records": "store record",
}

#: the header that carries a message's ``HEADERS`` version (absent: an older release's
#: message or a foreign producer's, read as version 1)
HEADER: Final = "cc_format"
#: the JSON field that carries a record's version (absent: 1)
RECORD_FIELD: Final = "v"
#: the key of an outbox row's ``headers`` JSON that carries the row's version (absent: 1)
ROW_FIELD: Final = "_cc_row"
#: the largest version number a reader takes as one (anything else is junk, not a version)
MAX_VERSION: Final = 1_000_000

_NEW_RELEASE = "written by a newer release"


def current(name: str) -> int:
    """The version of format ``name`` (a key of ``READS_FROM``) this release writes."""
    return int(getattr(sys.modules[__name__], name.upper()))


def version_of(value: Any) -> int | None:
    """``value`` as a version number (an int, or digits), None when it is not one."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 8:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        return None
    return value


def newer(name: str, found: int) -> NewerFormat | None:
    """The error for a ``found`` version of ``name`` newer than this release reads, or
    None when this release reads it."""
    reads = current(name)
    if found <= reads:
        return None
    return NewerFormat(
        f"{WHAT[name]} version {found} was {_NEW_RELEASE} (this one reads up to "
        f"{reads}): not read",
        name=name, found=found, reads=reads,
    )  # fmt: skip


def message_refusal(headers: Mapping[str, Any]) -> str | None:
    """The dead letter's reason for a message whose ``cc_format`` is newer than this
    worker reads, or None (no header: an older release or a foreign producer, read as
    always; a value that is no version: the same, the header reader warns)."""
    raw = headers.get(HEADER)
    if raw is None or raw == HEADERS:  # every message of this release or an older one
        return None
    found = version_of(raw)
    error = None if found is None else newer("headers", found)
    if error is None:
        return None
    return (
        f"message format version {error.found} was {_NEW_RELEASE} (this worker reads "
        f"up to {error.reads}): replay once the fleet runs the new release"
    )


def check_record(data: Mapping[str, Any], what: str = "record") -> None:
    """Raise ``NewerFormat`` when the JSON ``data`` of a stored record carries a ``v``
    newer than ``RECORDS``; a record without one is version 1."""
    found = data.get(RECORD_FIELD)
    if found is None or found == 1:
        return
    version = version_of(found) or MAX_VERSION  # junk in ``v``: not ours to read either
    error = newer("records", version)
    if error is not None:
        error.args = (
            f"{what} {_NEW_RELEASE} (record version {version}; this one reads up to "
            f"{error.reads}): upgrade this process to read it",
        )
        raise error


def record_stamp() -> dict[str, int]:
    """The fields a writer adds to a record's JSON: none at version 1."""
    version = current("records")
    return {} if version == 1 else {RECORD_FIELD: version}


def row_problem(headers: Mapping[str, Any] | None) -> NewerFormat | None:
    """The error for an outbox row whose ``headers`` JSON says it is newer than this
    release reads (a relay leaves it to a newer relay), or None."""
    found = (headers or {}).get(ROW_FIELD)
    if found is None:
        return None
    error = newer("outbox_row", version_of(found) or MAX_VERSION)
    if error is not None:
        error.args = (
            f"outbox row {_NEW_RELEASE} (row version {error.found}; this relay reads up "
            f"to {error.reads}): left for a relay of the new release",
        )
    return error


def stamp_problem(name: str, stamp: int | None) -> str | None:
    """What a store's stamp of format ``name`` means for this release, as an error the
    doctor or a starting worker reports (None: this release reads it).

    ``stamp`` is the version the store says it holds; None (no stamp yet) is version 1,
    the layout of every store before stamps. Newer than this release: upgrade this
    process, or roll the store back with the release that migrated it. Older than
    ``READS_FROM``: run ``conventions migrate --apply`` with this release first.
    """
    found = 1 if stamp is None else stamp
    writes, oldest = current(name), READS_FROM[name]
    if found > writes:
        return (
            f"the {WHAT[name]} is version {found}, {_NEW_RELEASE} (this one reads "
            f"{oldest} to {writes}): upgrade this process to the release the fleet runs, "
            "or roll the store back before running this one"
        )
    if found < oldest:
        return (
            f"the {WHAT[name]} is version {found}, older than this release reads (from "
            f"{oldest}): run `conventions migrate` to see the steps, then "
            "`conventions migrate --apply`"
        )
    return None


def stamp_problems(stamps: Mapping[str, int | None]) -> list[str]:
    """:func:`stamp_problem` of each ``name -> stamp`` of ``stamps`` that has one, in
    the order given (the doctor's errors; a worker refuses to start on any)."""
    return [problem for name, stamp in stamps.items() if (problem := stamp_problem(name, stamp))]

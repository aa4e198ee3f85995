"""The doctor's format checks: each place's stamp against this release's versions.

Read once at worker and beat start (and by ``conventions doctor``), never per job:

* ``format-newer-than-release`` (error): a place is stamped with a version newer than
  this release writes (a newer release migrated it): refuse to start, upgrade the
  worker (or run the fleet on the newer release).
* ``format-migration-pending`` (error when this release no longer reads the stamped
  version, a warning while it still does): the command to run is in the message.
* ``format-stamp-invalid`` (error): a version in the stamp is not a whole number
  (``2.0``, ``abc``): the layer never wrote it, so nothing can tell which format the
  data is in; refuse to start (never read as unstamped, never overwritten) until a person
  sets it to the version the data is at.
* ``format-unreadable`` (warning): the stamp could not be read (the place did not
  answer: the worker's own first use will say more).

At worker and beat start an unstamped Redis place (the store, the transport's keys) is
stamped at the version it is recognized at (:data:`conventions.upgrade.places.
RECOGNIZED`); the SQL store stamps itself when it creates its tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conventions.config import formats
from conventions.ops.findings import ERROR, WARNING, Finding
from conventions.store.stamps import InvalidStamp, versions
from conventions.tracing.scrubbing import scrub_text
from conventions.upgrade.places import RECOGNIZED, Place, known, places

#: what the operator runs (``-A`` is the project's app)
COMMAND = "celery -A <your app> conventions migrate --apply"


#: seconds the broker's Redis may take per reply here (the doctor's own bound)
TIMEOUT = 5.0


def format_findings(app: Any, *, write: bool, timeout: float = TIMEOUT) -> list[Finding]:
    """The findings of every place of ``app``; ``write``: stamp the unstamped Redis ones.
    An app without a store has no place to check."""
    settings = getattr(app, "conventions_settings", None)
    if settings is None or not settings.store_url:
        return []
    try:
        with places(app, timeout) as found:
            findings = [f for place in found for f in place_findings(place, write=write)]
            for place in found:
                if place.kind == "sql_store":
                    _release_pool(place.handle._engine)
            return findings
    except Exception as exc:  # no store configured, a place that does not answer
        return [_unreadable("stores", exc)]


def _release_pool(engine: Any) -> None:
    """At worker start, before the pool forks: no pooled connection left for the children
    to inherit (SQLAlchemy's advice). Not while a connection of the engine is checked
    out (a worker run in-process beside code of the app's, a test's): dispose would
    detach it from its pool, to be garbage-collected unclosed; the children forget the
    store after the fork anyway (``worker_process_init``)."""
    checked_out = getattr(engine.pool, "checkedout", None)
    if checked_out is None or checked_out() == 0:
        engine.dispose()


def place_findings(place: Place, *, write: bool) -> Iterator[Finding]:
    """One place's findings, against this release's versions (read at call time from
    :mod:`conventions.config.formats`; the message is :func:`formats.stamp_problem`'s)."""
    try:
        stamped = versions(place.stamp.read(), place.stamp.where)
        if write and place.kind != "sql_store":
            for name in place.formats([]):
                if name not in stamped:
                    stamped[name] = place.stamp.stamp_missing(name, RECOGNIZED)
    except InvalidStamp as exc:
        yield Finding(ERROR, "format-stamp-invalid", place.stamp.where, str(exc))
        return
    except Exception as exc:
        yield _unreadable(place.stamp.where, exc)
        return
    for name, version in sorted(stamped.items()):
        if not known(name):
            continue  # a format this release does not know (a test's)
        mine, problem = formats.current(name), formats.stamp_problem(name, version)
        if version > mine:
            yield Finding(ERROR, "format-newer-than-release", place.stamp.where, str(problem))
        elif problem is not None:
            yield Finding(
                ERROR, "format-migration-pending", place.stamp.where,
                f"{problem} (celery -A <your app> conventions migrate --apply)",
            )  # fmt: skip
        elif version < mine:
            yield Finding(
                WARNING, "format-migration-pending", place.stamp.where,
                f"{name} is at version {version}, this release's is {mine} (it still reads "
                f"it meanwhile): run {COMMAND} (a dry run without --apply shows the steps)",
            )  # fmt: skip


def _unreadable(where: str, exc: Exception) -> Finding:
    return Finding(
        WARNING, "format-unreadable", where,
        f"could not read the format stamp ({scrub_text(str(exc))[:200]}); run "
        "conventions migrate (a dry run) once the store answers",
    )  # fmt: skip

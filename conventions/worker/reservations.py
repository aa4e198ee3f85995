"""Give the idempotency key back when Celery discards a job without running it.

A ``dedup="until_done"`` reservation is dropped when the job ends (done, dead-lettered,
skipped). A job that never runs would hold it for ``conventions_ledger_keep`` (7 days),
deduplicating every later ``.delay()`` of the key against a job that no longer exists.
Celery's worker discards a message without running it in two cases, and says so with
its ``task_revoked`` signal (sent in the worker's main process):

* revoked: ``app.control.revoke``, ``celery control revoke``, Flower's revoke button,
  a revoke by stamped header, or ``terminate=True`` on a running job;
* expired: ``expires`` had passed when the worker received it (``expired=True``).

The handler drops the reservation only if it is still held by that job id (a newer job
of the same key keeps its own) and records a ``revoked`` or ``expired`` audit event.
The key is the message's ``cc_idempotency_key`` header, or, for a message published
without it (an older producer), computed from its kwargs with the task's key template.

A store that cannot be reached is logged, never raised into Celery: the reservation
then expires after its ttl, as before. A purged queue sends no signal at all: after
``celery purge`` use ``conventions keys clear`` (:mod:`conventions.cli.keys`).

Each ``App`` connects the handler for its own jobs when it is created
(:mod:`conventions.worker.wiring`); importing this module does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from conventions.batches import callbacks as batch_callbacks
from conventions.jobs.protocol import JobTask
from conventions.observability import audit
from conventions.store import keys as naming
from conventions.store.batches import FAILED
from conventions.tracing import headers as hdr
from conventions.worker import batch_ends

logger = logging.getLogger("conventions.worker.reservations")


def on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: Any,
) -> None:
    """Celery discarded ``request``'s message: release its key and say why (connected by
    each app for its own convention jobs: ``conventions.worker.wiring``)."""
    if request is None:
        return
    task_id = getattr(request, "id", None)
    if not task_id:
        return
    try:
        release(sender, str(task_id), request, expired=expired, terminated=terminated)
    except Exception:  # a signal handler never raises into the worker
        logger.exception("could not release the key of revoked job %s[%s]", sender.name, task_id)


def release(task: JobTask, task_id: str, request: Any, *, expired: bool, terminated: bool) -> None:
    """Drop ``task_id``'s reservation of its key (if it still holds it), end it as failed
    in its batches (``cc_batch``: it will not run, so ``on_complete`` must not wait for
    it), and record the ``revoked`` / ``expired`` audit event."""
    headers = _headers_of(request)
    keys = key_of(task, getattr(request, "kwargs", None), headers)
    if keys is None:
        logger.warning("%s[%s] was revoked; its idempotency key is unknown", task.name, task_id)
        return
    key, headers[hdr.IDEMPOTENCY_KEY] = keys
    store = task.store
    member = batch_ends.member_of(headers, task.name, key)
    fired: list[str] = []
    # a batch member's keys are in its batch's slot on a cluster
    with naming.batch_home(key, member.root if member else None):
        if task.dedup == "until_done":
            store.unreserve(key, task_id)
        if member:  # it will not run: it ended, failed (no dead letter: nothing to replay)
            fired = store.end_member(member.move(FAILED, task_id))
    audit.record(
        store, "expired" if expired else "revoked", task.name, task_id, headers,
        attempt=int(getattr(request, "retries", 0) or 0),
        detail={"expired": bool(expired), "terminated": bool(terminated)},
    )  # fmt: skip
    if fired:  # the member was its batch's last: on_complete is due now
        batch_callbacks.publish_due(task.app, fired)


def key_of(task: JobTask, kwargs: Any, headers: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(store key, key)`` of a message, as its delivery would run under them
    (``ConventionTask.run_key``); None when the kwargs are not a valid payload."""
    if not isinstance(kwargs, Mapping):
        return None
    try:
        payload = task.payload.parse(dict(kwargs), task=task.name)
        return task.run_key(task.upcast_payload(payload), headers)
    except Exception:  # a bad payload, or a key callable that raises on it: no key
        return None


def _headers_of(request: Any) -> dict[str, Any]:
    """Our headers as the request carries them (Celery's Context keeps them as attributes)."""
    found = {name: getattr(request, name, None) for name in hdr.ALL_HEADERS}
    return {name: value for name, value in found.items() if value is not None}

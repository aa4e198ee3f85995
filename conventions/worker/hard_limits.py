"""The request a job killed by its hard time limit is dead-lettered from.

Celery handles a hard time limit in the worker's main process (``Request.on_timeout``):
it stores the FAILURE, then calls the task's ``on_failure`` with the job's id, args and
kwargs only. The headers the job carried (its batch, ``cc_batch``; its correlation;
its first failure) are on the worker's ``Request``, not on the task: without them the
dead letter could not end the job in its batch, and its replay would not either (a lost
batch callback). :class:`HardLimitRequest` (every convention task's ``Request``) hands
the job's request to ``on_failure`` for the length of that call.
"""

from __future__ import annotations

import contextvars
from typing import Any

from celery.worker.request import Request

#: the request of the job whose hard time limit is being handled in this thread
_TIMED_OUT: contextvars.ContextVar[Any] = contextvars.ContextVar("cc_hard_limit", default=None)


class HardLimitRequest(Request):  # type: ignore[misc]
    """Celery's worker request, whose hard time limit tells ``on_failure`` the request."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft:
            super().on_timeout(soft, timeout)
            return
        token = _TIMED_OUT.set(self._context)
        try:
            super().on_timeout(soft, timeout)
        finally:
            _TIMED_OUT.reset(token)


def timed_out_request(task_id: str) -> Any:
    """The request (a Celery ``Context``: its headers as attributes) of job ``task_id``
    while its hard time limit is handled, or None elsewhere."""
    request = _TIMED_OUT.get()
    return request if request is not None and getattr(request, "id", None) == task_id else None

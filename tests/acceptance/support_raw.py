"""Raw Celery, for comparison: the same payment effect with no layer at all.

``raw.apply_event`` applies a payment event exactly as ``payments.apply_event.v1`` does
(``shop.apply_payment`` in one transaction), but without ``once()``, the ledger or any
of the layer's settings. ``RAW_PROFILE`` picks the settings (read here: this app is a
test fixture, not part of the project, so ``celeryconfig.py`` does not describe it):

* ``default``: Celery's defaults (early acks, a one-hour visibility timeout);
* ``acks_late``: the reliable delivery settings (late acks, reject on worker lost,
  prefetch 1, the chaos suite's short visibility timeout and restore sweep) but no
  idempotency.

Started by the chaos suite as ``celery -A tests.acceptance.support_raw worker -Q celery``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from sqlalchemy import Engine

from tasks import shop

PROFILE = os.environ.get("RAW_PROFILE", "default")

app = Celery("raw", broker=os.environ["REDIS_URL"])
if PROFILE == "acks_late":
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": int(os.environ["CONVENTIONS_VISIBILITY_TIMEOUT"]),
            "unacked_restore_interval": int(os.environ["CONVENTIONS_UNACKED_RESTORE_INTERVAL"]),
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": int(os.environ["CONVENTIONS_UNACKED_MUTEX_EXPIRE"]),
        },
    )
elif PROFILE != "default":
    raise ValueError(f"RAW_PROFILE must be 'default' or 'acks_late', not {PROFILE!r}")

_engine: Engine | None = None


def _shop() -> Engine:
    global _engine  # noqa: PLW0603  (one engine per process, made after the fork)
    if _engine is None:
        _engine = shop.make_engine(os.environ["DATABASE_URL"])
    return _engine


@signals.worker_process_init.connect
def _forget_inherited_engine(**_: Any) -> None:
    global _engine  # noqa: PLW0603
    _engine = None


@app.task(name="raw.apply_event")
def apply_event(event_id: str) -> str:
    """Apply the payment event to its order: not idempotent, like the reference."""
    with shop.session_factory(_shop())() as session, session.begin():
        shop.apply_payment(session, event_id)
    return "applied"

"""The convention apps the benchmarks run (worker side and publish side).

Every app starts from ``celeryconfig`` (the reliable profile: late acks, reject on worker
lost, prefetch 1, events on, results with ``result_extended``, ``track_started``) and
changes only its routing, so that each variant has its own queue on the same Redis
database and several workers can stay up side by side. ``lean`` also turns off what a
job's caller rarely reads: stored results, the STARTED state and the "sent" event;
``tuned`` adds Celery's default prefetch (4 per process) to that, still with late acks;
``conv_noruns`` is the reliable profile without run history (``bench.scale`` weighs it);
``quiet_noruns`` is ``quiet`` without it, and ``quiet_bare`` is ``quiet`` without run
history or the audit events of the claim and the completion (no setting turns the audit
trail off: :class:`Unaudited` drops them, a bench-only measure of what they cost; the
ledger's claim and completion, dedup and the once-only promise stay).
The job body does nothing: what is measured is the cost of the machinery around it, the
worst case for the ratio.

Each app is made when first named (``bench.apps:quiet``): a worker or a publisher
process holds its own variant's app alone.

Raw Celery lives in :mod:`bench.apps_raw`, which never imports ``conventions``: our
``before_task_publish`` handler is process-wide and would otherwise run on raw publishes.
"""

from __future__ import annotations

from typing import Any

from bench import common
from conventions import App, Id, JobContext, Payload
from conventions.jobs import routing

#: each variant's settings on top of the reliable profile; the codec and the Redis
#: parser are process-wide, so ``bench.launch`` sets those (see ``bench.drain``)
VARIANTS: dict[str, dict[str, Any]] = {
    "conv": {},
    "lean": common.LEAN,
    "conv_orjson": {},
    "conv_hiredis": {},
    "lean_fast": common.LEAN,
    "tuned": common.TUNED,
    "quiet": common.QUIET,
    "conv_noruns": {"conventions_runs_enabled": False},
    "quiet_noruns": {**common.QUIET, "conventions_runs_enabled": False},
    "quiet_bare": {**common.QUIET, "conventions_runs_enabled": False},
}


class Noop(Payload):
    """An id-only payload, the shape of most real jobs."""

    order_id: Id


def queue(variant: str) -> str:
    """Each variant has its own queue on the shared benchmark database."""
    return f"bench_{variant}"


def task_name(variant: str) -> str:
    """Each variant's own task name (Celery shares tasks between apps by name)."""
    return f"bench.noop_{variant}.v1"


class Unaudited(App):
    """Bench only: an app whose worker claims and completes without their audit events
    (what the audit trail costs a job; not a setting of the layer)."""

    @property
    def store(self) -> Any:
        found = super().store
        if "_bench_unaudited" not in found.__dict__:
            for name in ("claim", "complete"):
                found.__dict__[name] = _without_audit(getattr(found, name))
            found.__dict__["_bench_unaudited"] = True
        return found


def _without_audit(method: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs["audit"] = None
        return method(*args, **kwargs)

    return call


def make(variant: str) -> App:
    """A convention app on the reliable profile whose only workload goes to its queue."""
    app = (Unaudited if variant == "quiet_bare" else App)(f"bench_{variant}")
    app.config_from_object("celeryconfig")
    workloads = {"bench": queue(variant)}
    app.conf.update(
        conventions_workloads=workloads,
        conventions_workload_time_limits={"bench": 60.0},
        conventions_retention_enabled=False,
        task_routes=(routing.WorkloadRouter(workloads),),
        task_default_queue=queue(variant),
        **VARIANTS[variant],
    )

    @app.job(task_name(variant), payload=Noop, key="noop:{order_id}", workload="bench")
    def noop(payload: Noop, ctx: JobContext) -> None:
        """Nothing: the machinery around the body is what is measured."""

    return app


#: the apps made so far (:func:`__getattr__`)
_MADE: dict[str, App] = {}


def __getattr__(name: str) -> App:
    """``bench.apps:<variant>`` (``celery -A``, the publishers): each variant's app is
    made when first named, so a process holds only its own, as a user's does. Every app
    connects its signal receivers (each returns at once for another app's job), so ten
    apps in a process would make every publish and every run call ten of each."""
    if name not in VARIANTS:
        raise AttributeError(name)
    if name not in _MADE:
        _MADE[name] = make(name)
    return _MADE[name]

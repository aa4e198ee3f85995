"""No effect at import; each App wires its own signal handlers, for its own tasks only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import redis
from celery import Celery

from tests.conftest import BROKER_DB, REDIS_BASE
from tests.fixtures import ROOT

#: what a publishing web process imports of the layer
WEB_IMPORTS = (
    "conventions",
    "conventions.app",
    "conventions.task",
    "conventions.jobs.payloads",
    "conventions.tracing.context",
    "conventions.contrib.web",
)
#: optional dependencies the core must not load
OPTIONAL = ("sqlalchemy", "psycopg", "sentry_sdk", "flower", "tornado", "prometheus_client")

PROBE = """
import json, logging, os, sys, weakref
def live(entry):
    return entry() if isinstance(entry, weakref.ReferenceType) else entry
def sockets():
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return found
factory, before = logging.getLogRecordFactory(), sockets()
import importlib
from celery import signals
for name in sys.argv[1].split(","):
    importlib.import_module(name)
ours = sorted(
    f"{name}:{live(entry).__module__}"
    for name in dir(signals)
    if isinstance(getattr(signals, name), signals.Signal)
    for _, entry in getattr(signals, name).receivers
    if str(getattr(live(entry), "__module__", "")).startswith("conventions")
)
print(json.dumps({
    "receivers": ours,
    "factory_replaced": logging.getLogRecordFactory() is not factory,
    "new_sockets": sockets() - before,
    "optional_loaded": sorted(m for m in sys.argv[2].split(",") if m in sys.modules),
}))
"""


def _clean_env() -> dict[str, str]:
    """This process's environment without ``DJANGO_SETTINGS_MODULE`` (other tests set it):
    with it, Celery's own Django fixup keeps the first app alive and connects receivers."""
    return {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}


def _probe(imports: tuple[str, ...]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(imports), ",".join(OPTIONAL)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True, env=_clean_env(),
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_importing_what_a_web_process_uses_connects_nothing_and_replaces_nothing() -> None:
    seen = _probe(WEB_IMPORTS)
    assert seen == {
        "receivers": [], "factory_replaced": False, "new_sockets": 0, "optional_loaded": [],
    }  # fmt: skip


APP_PROBE = """
import gc, json, weakref
from celery import signals
from conventions import App
def ours():
    return sum(
        1 for _, entry in signals.task_prerun.receivers
        if isinstance(entry, weakref.ReferenceType)
        and type(getattr(entry(), "__self__", None)).__name__ == "Wiring"
    )
app = App("one", set_as_current=False)
with_one = ours()
other = App("two", set_as_current=False)
with_two = ours()
del app, other
gc.collect()
print(json.dumps([with_one, with_two, ours()]))
"""


def test_an_app_connects_its_own_handlers_when_created_and_they_go_with_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", APP_PROBE],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True, env=_clean_env(),
    )  # fmt: skip
    assert json.loads(done.stdout) == [1, 2, 0]


def test_a_plain_celery_app_beside_a_conventions_app_gets_none_of_its_hooks(
    broker_redis: redis.Redis,
) -> None:
    """The reference app (a conventions App) is loaded in this process; a plain Celery
    app publishes its own task: the message carries none of the layer's headers."""
    import tasks  # noqa: F401  (the conventions app, with its handlers connected)

    queue = f"plain-{uuid.uuid4().hex[:8]}"
    plain = Celery("plain", broker=f"{REDIS_BASE}/{BROKER_DB}", set_as_current=False)
    plain.conf.task_default_queue = queue

    @plain.task(name="plain.ping")
    def ping() -> str:  # pragma: no cover (never run: the message is only read)
        return "pong"

    try:
        ping.apply_async()
        raw = broker_redis.lpop(queue)
        assert raw is not None
        headers = json.loads(raw)["headers"]
        assert headers["task"] == "plain.ping"
        assert not [name for name in headers if name.startswith("cc_")], headers
    finally:
        broker_redis.delete(queue)
        plain.close()

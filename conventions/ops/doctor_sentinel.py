"""The doctor's Redis Sentinel checks: a ``sentinel://`` broker, result backend or store
that cannot find its primary, and what a failover can lose with the settings found.

Read from the configuration alone (no server is asked): ``conventions doctor`` reports
them with the other configuration findings. What each one means is in the "Redis
Sentinel" section of ``docs/discussions/delivery-guarantees.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from conventions.config import profile, sentinel
from conventions.ops.findings import ERROR, WARNING, Finding

#: what a failover loses when nothing waits for a replica
UNREPLICATED = (
    "Redis replicates asynchronously: a failover loses the writes the primary "
    "acknowledged and no replica had yet"
)


def _options(conf: Any, key: str) -> Mapping[str, Any]:
    found = conf.get(key)
    return found if isinstance(found, Mapping) else {}


def _wanted(options: Mapping[str, Any]) -> int:
    try:
        return int(options.get("min_replicas") or 0)
    except (TypeError, ValueError):
        return 0


def findings(conf: Any) -> Iterator[Finding]:
    """Every Sentinel finding of ``conf`` (nothing when no URL is a Sentinel one)."""
    yield from broker_findings(conf)
    yield from result_findings(conf)
    yield from store_findings(conf)


def sentinel_findings(conf: Any) -> Iterator[Finding]:
    """The former name of :func:`findings` (``conventions.ops.doctor_time`` calls it)."""
    yield from findings(conf)


def broker_findings(conf: Any) -> Iterator[Finding]:
    """A Sentinel broker: its group named, kombu's stock transport and what it gives
    up, publishes that no replica confirmed."""
    url = conf.get("broker_url")
    if not sentinel.is_sentinel(url):
        return
    options = _options(conf, "broker_transport_options")
    if not options.get("master_name"):
        yield Finding(
            ERROR, "sentinel-master-name-missing", "broker_transport_options",
            "a sentinel:// broker needs broker_transport_options={'master_name': "
            "'<the group the sentinels monitor>'}: without it no primary can be found",
        )  # fmt: skip
    if not profile.names_layer_transport(conf.get("broker_transport")):
        yield Finding(
            WARNING, "sentinel-stock-transport", "broker_transport",
            f"sentinel:// runs on {sentinel.STOCK}; set broker_transport="
            f"{profile.INBOX_TRANSPORT!r}, which follows the primary across a failover",
        )  # fmt: skip
        return
    if _wanted(options) < 1:
        yield Finding(
            WARNING, "sentinel-publish-not-replicated", "broker_transport_options",
            f"min_replicas is 0: {UNREPLICATED}, so a job whose .delay() returned can "
            "vanish; set broker_transport_options['min_replicas']=1 (and "
            "'replica_wait_ms') to have every publish on a replica before it returns",
        )  # fmt: skip


def result_findings(conf: Any) -> Iterator[Finding]:
    """A Sentinel result backend without its group's name."""
    backend = conf.get("result_backend")
    url = backend.split("+", 1)[1] if isinstance(backend, str) and "+" in backend else backend
    if not sentinel.is_sentinel(url):
        return
    if not _options(conf, "result_backend_transport_options").get("master_name"):
        yield Finding(
            ERROR, "sentinel-master-name-missing", "result_backend_transport_options",
            "a sentinel:// result backend needs result_backend_transport_options="
            "{'master_name': ...}",
        )  # fmt: skip


def store_findings(conf: Any) -> Iterator[Finding]:
    """A Sentinel store: its group named; its ledger writes confirmed by a replica."""
    url = conf.get("conventions_store_url")
    if not sentinel.is_sentinel(url):
        return
    try:
        parsed = sentinel.parse(str(url))
    except ValueError as exc:
        yield Finding(ERROR, "sentinel-store-url", "conventions_store_url", str(exc))
        return
    if not parsed.master_name:
        yield Finding(
            ERROR, "sentinel-master-name-missing", "conventions_store_url",
            "a sentinel:// store URL needs ?master_name=<the group the sentinels monitor>",
        )  # fmt: skip
    if _wanted(parsed.options) < 1:
        yield Finding(
            WARNING, "sentinel-store-not-replicated", "conventions_store_url",
            f"min_replicas is 0: {UNREPLICATED}; a lost ledger completion lets a job "
            "delivered again run its effect twice, a lost claim lets two workers run it; "
            "add &min_replicas=1 to the store URL",
        )  # fmt: skip

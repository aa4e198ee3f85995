"""The layer's Redis transport on Redis Sentinel: what following a failover needs.

``broker_url = "sentinel://a:26379;sentinel://b:26379"`` with
``broker_transport_options={"master_name": "main"}`` and the layer's transport: its
:class:`~conventions.transport.redis.Transport` makes a
:class:`~conventions.transport.redis.SentinelChannel` (the layer's channel combined
with kombu's ``SentinelChannel``) whenever the options name a ``master_name`` or the
URL names a sentinel. Every connection of such a channel asks the sentinels for the
current primary when it connects (redis-py's ``SentinelManagedConnection``); a primary
that dies or is demoted drops its clients (Sentinel kills them, a demoted one answers
``READONLY``/``UNBLOCKED``), the worker reconnects, and the inbox fetch, the delayed
sets, the keeper and the liveness scores all run on the new primary.

Liveness across a failover. A consumer's score in ``_cc.consumers`` is an instant of
the primary's clock (``TIME`` + ``recovery_timeout``), and a new primary is another
machine: a clock ahead of the old one would make every score lapse early, and the
sweep would give a live consumer's inbox back. So a keeper (:class:`FollowingKeeper`)
learns its primary's ``run_id`` at every beat; when it changes, it does not sweep for
one beat period: by then every live keeper has renewed its score with the new clock
(they all renew at least once a period), and only a consumer that really is gone
lapses. The held messages' ``unacked_index`` scores are the workers' own clocks, which
a failover does not change.

What a failover can lose (Redis replicates asynchronously): the writes the old primary
acknowledged and no replica had yet. ``min_replicas``/``replica_wait_ms`` (transport
options) make every publish wait for that many replicas in the same round trip
(:class:`~conventions.config.sentinel.Replicated`); the rest of what may be lost (a
claim, an ack, a liveness score) only delivers a job again, which the ledger makes
harmless when the store's writes wait too.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

from conventions.config.sentinel import SCHEMES
from conventions.transport import liveness

logger = logging.getLogger("conventions.transport.sentinel")

#: the transport options of a Sentinel channel beyond the layer's Redis ones (kombu's)
SENTINEL_OPTIONS = ("master_name", "min_other_sentinels", "sentinel_kwargs",
                    "sentinel_fanout_compat")  # fmt: skip


def wanted(client: Any) -> bool:
    """Whether a kombu connection (``client``) is a Sentinel one: its options name a
    ``master_name``, or one of its URLs is ``sentinel://``."""
    options = getattr(client, "transport_options", None) or {}
    if options.get("master_name"):
        return True
    urls = [*(getattr(client, "alt", None) or []), str(getattr(client, "hostname", "") or "")]
    return any(str(url).startswith(SCHEMES) for url in urls)


def primary_of(client: Any) -> str:
    """The ``run_id`` of the server ``client`` talks to: a new one after a failover."""
    return str(client.info("server").get("run_id") or "")


class FollowingKeeper(liveness.Keeper):
    """A keeper that holds its sweeps for one beat period after its primary changed
    (see the module): a new primary's clock never makes a live consumer look dead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the run id of the primary of the last beat (None: none yet)
        self.primary: str | None = None
        #: monotonic time before which this keeper does not sweep
        self.quiet_until = 0.0
        self.failovers = 0

    def beat(self) -> int:
        renewed = super().beat()
        self.follow(primary_of(self.client()))
        return renewed

    def follow(self, primary: str) -> None:
        """Note the primary of the last beat; a new one holds the sweeps a period."""
        if self.primary is not None and primary != self.primary:
            self.failovers += 1
            self.quiet_until = monotonic() + self.period
            logger.warning("keeper of consumer %s: the primary changed (run id %s); "
                           "sweeping again in %.0fs, once every live consumer renewed",
                           self.consumer, primary[:8], self.period)  # fmt: skip
        self.primary = primary

    def sweep(self) -> int:
        if monotonic() < self.quiet_until:
            return 0
        return super().sweep()

"""Checks made once when a channel of :mod:`conventions.transport.redis` is made: the kombu
members it relies on are there, and its timing settings cannot open a gap
or strand an orphan for long.

The transport subclasses kombu's Redis channel and uses members that are not kombu's
public API (kombu 5.6 lacks some: every fetch raised ``AttributeError``). A kombu outside
the pinned range fails here, in one line naming the member, instead of at the first
fetch; ``tests/compat/test_kombu_members.py`` also checks their signatures.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kredis
from kombu.transport import virtual

from conventions.errors import ConfigurationError

#: the least ``recovery_timeout`` may exceed the longest block by, and the factor it must
#: exceed it by: a sign of life must outlast the fetch it was sent with, with room left
INBOX_MARGIN = 1.0
INBOX_FACTOR = 2.0
#: a dead worker's jobs are back within ``recovery_timeout`` (its sign of life lapses) plus
#: a third of it (the next sweep) plus a third more (``unacked_mutex_expire``, the profile's:
#: a sweeper killed holding kombu's restore mutex): 5/3 of it
BOUND_FACTOR = 5 / 3
#: the longest recovery bound allowed (seconds): a dead worker's jobs run again within a minute
MAX_BOUND = 60.0
#: the longest ``recovery_timeout`` taken (seconds): 36, a bound of 60
MAX_RECOVERY = MAX_BOUND / BOUND_FACTOR


#: kombu members the transport relies on, none of them public API: checked once, when
#: the first channel is made (a one-line error names a missing one), and with their
#: signatures by ``tests/compat/test_kombu_members.py``. Pinned: kombu >=5.7,<5.8.
KOMBU_MEMBERS: dict[str, tuple[str, ...]] = {
    "redis.Channel": (
        "_brpop_start", "_brpop_read", "_create_client", "_put", "_q_for_pri",
        "_get_message_priority", "_flush_brpop_reauth", "_in_poll", "_brpop_sent_at",
        "conn_or_acquire", "from_transport_options", "unacked_key", "unacked_index_key",
        "priority_steps", "sep", "client", "pool", "active_queues", "close",
        "basic_consume", "basic_cancel", "codecs", "decode_body", "_do_restore_message",
        "_lookup",
    ),
    "redis.QoS": ("append", "restore_visible"),
    "virtual.QoS": ("append",),
    "virtual.Transport": ("_deliver",),
}  # fmt: skip
#: members kombu sets on each channel (and its QoS) as it makes it
KOMBU_INSTANCE_MEMBERS = ("_queue_cycle", "brpop_timeout", "connection_errors", "qos")
_checked: list[bool] = []


def check_kombu(channel: Any) -> None:
    """Raise one line naming the first kombu member this transport needs that is gone
    (a kombu outside the pinned range); once per process."""
    if _checked:
        return
    modules = {"redis": kredis, "virtual": virtual}
    for owner, names in KOMBU_MEMBERS.items():
        module, cls = owner.split(".")
        missing = [n for n in names if not hasattr(getattr(modules[module], cls), n)]
        if missing:
            raise ImportError(_missing(f"kombu.transport.{owner}.{missing[0]}"))
    gone = [n for n in KOMBU_INSTANCE_MEMBERS if not hasattr(channel, n)]
    gone += [f"_queue_cycle.{n}" for n in ("consume", "rotate")
             if not gone and not hasattr(channel._queue_cycle, n)]  # fmt: skip
    if not gone and not hasattr(channel.qos, "_vrestore_count"):
        gone.append("qos._vrestore_count")
    if gone:
        raise ImportError(_missing(f"kombu.transport.redis.Channel().{gone[0]}"))
    _checked.append(True)


def _missing(member: str) -> str:
    return (
        f"conventions.transport.redis needs {member}, which this kombu does not have: install the "
        "kombu range celery-conventions is tested with (kombu>=5.7,<5.8)"
    )


def check_timing(recovery_timeout: float, block: float, fetch_wait: float, renew: bool = True) -> (
    None
):  # fmt: skip
    """Refuse settings under which a consumer's sign of life could run out while its
    fetch still waits (a sweep would take a live consumer for dead), or that would let
    an orphan's messages wait longer than :data:`MAX_RECOVERY` to come back."""
    if not block or block <= 0 or fetch_wait <= 0:
        raise ConfigurationError(
            "broker_transport_options: a fetch must block for a bounded time: give "
            f"polling_interval (the block, now {block!r}) and fetch_wait (now "
            f"{fetch_wait!r}) a number of seconds above 0"
        )
    longest = max(block, fetch_wait)
    least = max(INBOX_FACTOR * longest, longest + INBOX_MARGIN)
    if recovery_timeout < least:
        raise ConfigurationError(
            f"broker_transport_options: recovery_timeout={recovery_timeout:g} must be at "
            f"least {least:g} s, well above the {longest:g} s a fetch may block "
            "(polling_interval): a consumer's sign of life must outlast each fetch it is sent "
            f"with; raise recovery_timeout (default 30) or lower polling_interval"
        )
    if renew and recovery_timeout > MAX_RECOVERY:
        raise ConfigurationError(
            f"broker_transport_options: recovery_timeout={recovery_timeout:g} is above "
            f"{MAX_RECOVERY:g} s: a dead worker's jobs would wait up to {BOUND_FACTOR:.2g} times "
            f"that ({recovery_timeout * BOUND_FACTOR:.0f} s, above {MAX_BOUND:g}) to run again; a "
            "live worker renews its jobs, so a long job needs no longer timeout"
        )

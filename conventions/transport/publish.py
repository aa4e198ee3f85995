"""The publish in one round trip: the enqueue reservation inside kombu's ``LPUSH``.

A convention ``.delay()`` needs the reservation (enqueue dedup, with its ``published``
audit event) before the message may go out. Done as its own store call it is one more
Redis round trip than raw Celery's publish, which on one machine costs about as much as
Celery building the whole message. When the broker goes through
:mod:`conventions.transport.redis` and the store is a :class:`~conventions.store.redis.RedisStore`
on the **same Redis server** (any database: the reference config uses one URL for both),
``ConventionTask.apply_async`` hands the transport a push hook instead: one script, on
the broker's connection, reserves the key and records the audit event in the store's
database, then pushes the message in the broker's and rings its queue's bell (which
wakes an idle consumer of several queues: :mod:`conventions.transport.fetch`). A key
another job holds raises :class:`Deduplicated` from inside the publish, before anything
is pushed; the task answers the holder's handle, as the two-step path does. A message
with a countdown or an ``eta`` still ahead goes to its queue's delayed set
(:mod:`conventions.transport.delayed`): its hook reserves first, then adds it there (two
round trips, on that path only).

Otherwise (another server, the SQL store, eager mode, kombu's own transport) the task
reserves first and publishes second, as before.

"The broker's server" is the one Celery publishes to: ``broker_write_url`` when it is set,
else ``broker_url``. A failover list (``redis://a;redis://b``, or a list) or any URL that
is not plain ``redis://``/``rediss://`` may publish to a server other than the one it
names: it takes the two-step path. A ``sentinel://`` broker is one trip when the store
follows the same group (``sentinel://...?master_name=`` of the broker's ``master_name``,
a sentinel in common): both are on the group's current primary, whichever it is. With
the ``min_replicas`` transport option the script's round trip carries the ``WAIT`` too,
which covers the reservation and the push alike. The push hook checks once more
against the connection that really publishes (a ``connection=`` or ``producer=`` the
caller passed may go elsewhere): on another server it reserves in the store first and
then pushes, the two-step path inside the publish, so the reservation and the
``published`` event always land where the store looks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from conventions.config import sentinel
from conventions.config.profile import INBOX_TRANSPORT, publish_timeout
from conventions.errors import BackendUnavailable
from conventions.store.outages import UNREACHABLE, unreachable
from conventions.store.records import AuditEvent
from conventions.store.redis import RedisStore
from conventions.tracing.scrubbing import scrub_text
from conventions.transport import delayed
from conventions.transport import redis as broker


class Deduplicated(Exception):
    """Raised from inside a publish: the key is held by ``holder``; nothing was pushed."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"the idempotency key is held by job {holder}")
        #: the holder's job id; a ``Holder`` carries the fingerprint it reserved with
        self.holder = holder


def eligible(app: Any, store: Any) -> bool:
    """Whether ``app`` publishes through the inbox transport to the store's Redis server
    (worked out once per app and store)."""
    cached = app.__dict__.get("_cc_onetrip")
    if cached is not None and cached[0] is store:
        return bool(cached[1])
    answer = _same_server(app.conf, store)
    app.__dict__["_cc_onetrip"] = (store, answer)
    return answer


def _same_server(conf: Any, store: Any) -> bool:
    if not isinstance(store, RedisStore) or conf.get("task_always_eager"):
        return False
    transport = conf.get("broker_transport")
    if not (transport == INBOX_TRANSPORT or transport is broker.Transport):
        return False
    written = conf.get("broker_write_url") or conf.get("broker_url")
    if sentinel.is_sentinel(written):  # one group's primary, whichever server it is
        options = conf.get("broker_transport_options") or {}
        return sentinel.same_group(written, options.get("master_name"), store.client)
    if not isinstance(written, str) or ";" in written:  # a failover list: in doubt
        return False
    url = urlsplit(written)
    if url.scheme not in ("redis", "rediss"):
        return False
    return store.shares_server(url.hostname, url.port or 6379)


def _publishes_to_store(store: RedisStore, client: Any) -> bool:
    """Whether ``client`` (the connection that publishes) talks to the store's server."""
    grouped = sentinel.same_primary(client, store.client)
    if grouped is not None:  # a Sentinel group on either side
        return grouped
    pool = getattr(client, "connection_pool", None)
    params = getattr(pool, "connection_kwargs", None)
    if not isinstance(params, dict):
        return False
    return store.shares_server(params.get("host") or params.get("path"), params.get("port"))


def hook(  # noqa: PLR0917
    store: Any,
    task_id: str,
    key: str | None,
    ttl: float | None,
    audit: AuditEvent,
    fingerprint: str | None = None,
) -> Push:
    """The push of ``task_id``'s message with its reservation, which keeps the payload's
    ``fingerprint`` (``key=None``: the audit event only, for a task without enqueue
    dedup)."""

    redis_store = cast(RedisStore, store)  # eligible() checked it

    def push(client: Any, queue_list: str, message: str, events: Sequence[tuple[str, str]]) -> None:
        pushed.tried = True
        if not _publishes_to_store(redis_store, client):

            def send() -> None:
                broker.push_and_ring(client, queue_list, message)
                with contextlib.suppress(*UNREACHABLE):  # pushed: only the event lost
                    for channel, payload in events:
                        client.publish(channel, payload)

            _reserve_then_push(redis_store, send, key, task_id, ttl, audit, fingerprint)
            return
        holder = redis_store.reserve_and_push(
            client,
            queue_list,
            message,
            key,
            task_id,
            ttl,
            audit,
            fingerprint,
            bell=(broker.bell_of(queue_list), broker.BELL_CAP, broker.BELL_TTL),
            events=events,
        )
        if holder is not None:
            raise Deduplicated(holder)

    def push_delayed(client: Any, delayed_set: str, due: float, member: str) -> None:
        pushed.tried = True

        def add() -> None:
            delayed.push(client, delayed_set, due, member)

        _reserve_then_push(redis_store, add, key, task_id, ttl, audit, fingerprint)

    pushed = Push(task_id, push, push_delayed=push_delayed)
    return pushed


def sent_events(app: Any) -> Any:
    """The event dispatcher of the one-trip publishes (``send_task_message``'s
    ``event_dispatcher``; Celery's own buffers a ``task-sent`` it could not publish and
    goes on): the push runs inside the event's publish, so its failure, or a
    :class:`Deduplicated`, must reach the caller. Celery's app-wide settings and clock,
    as its own; one per app."""
    found = app.__dict__.get("_cc_sent_events")
    if found is None:
        found = app.events.Dispatcher(enabled=False, buffer_while_offline=False)
        app.__dict__["_cc_sent_events"] = found
    return found


@dataclass
class Push(broker.PushHook):
    """The push hook of one publish; ``tried``: it was called, so a reservation may have
    been made (a publish that failed before it reserved nothing and pushed nothing)."""

    tried: bool = False


def _reserve_then_push(  # noqa: PLR0917
    store: RedisStore,
    send: Callable[[], Any],
    key: str | None,
    task_id: str,
    ttl: float | None,
    audit: AuditEvent,
    fingerprint: str | None,
) -> None:
    """The two-step path, for a connection that publishes to another server or a
    message that goes to a delayed set: the reservation (or, without one, the audit
    event after the push) in the store, then ``send`` (kombu's own ``LPUSH``, or the
    delayed set's ``ZADD``) on the publishing connection. A retried publish runs it
    again: the reservation is already this job's, and records nothing twice (and a
    delayed member added twice is one)."""
    if key is not None:
        with bounded({}, "store"):  # not a broker error: kombu must not retry it as one
            holder = store.reserve(key, task_id, ttl, audit=audit, fingerprint=fingerprint)
        if holder is not None:
            raise Deduplicated(holder)
    send()
    if key is None:
        with contextlib.suppress(*UNREACHABLE):  # pushed: the job is out, only its event lost
            store.add_audit(audit)


@contextlib.contextmanager
def bounded(conf: Any, backend: str) -> Iterator[None]:
    """Turn a ``backend`` (``"broker"`` or ``"store"``) that is down or does not answer
    into one :class:`~conventions.errors.BackendUnavailable` with a one-line message;
    every other error passes unchanged."""
    try:
        yield
    except BackendUnavailable:
        raise
    except Exception as exc:
        if not unreachable(exc):
            raise
        raise BackendUnavailable(describe(conf, backend, exc), backend=backend) from exc


def describe(conf: Any, backend: str, exc: BaseException) -> str:
    """The one line of a refused publish: which backend, what it answered, the bound."""
    cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ else exc
    what = "the result backend" if isinstance(exc, RuntimeError) else f"the {backend}"
    reason = " ".join(scrub_text(str(cause)).split())[:200].rstrip(".") or type(cause).__name__
    return (
        f"{what} is unavailable ({reason}; publish timeout {publish_timeout(conf):g}s): "
        "nothing was published; retry later, or add the job to the outbox"
    )


def forget(app: Any, task_id: str) -> None:
    """Drop the result subscription Celery made for a publish that was deduplicated."""
    consumer = getattr(app.backend, "result_consumer", None)
    cancel = getattr(consumer, "cancel_for", None)
    if cancel is not None:
        with contextlib.suppress(Exception):  # never let a cleanup hide the answer
            cancel(task_id)

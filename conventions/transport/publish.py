"""The publish in one round trip: the enqueue reservation inside kombu's ``LPUSH``.

A convention ``.delay()`` needs the reservation (enqueue dedup, with its ``published``
audit event) before the message may go out. Done as its own store call it is one more
Redis round trip than raw Celery's publish, which on one machine costs about as much as
Celery building the whole message. When the broker goes through
:mod:`conventions.transport.redis` and the store is a :class:`~conventions.store.redis.RedisStore`
on the **same Redis server** (any database: the reference config uses one URL for both),
``ConventionTask.apply_async`` hands the transport a push hook instead: one script, on
the broker's connection, reserves the key and records the audit event in the store's
database, then pushes the message in the broker's. A key another job holds raises
:class:`Deduplicated` from inside the publish, before anything is pushed; the task
answers the holder's handle, as the two-step path does.

Otherwise (another server, the SQL store, eager mode, kombu's own transport) the task
reserves first and publishes second, as before.

"The broker's server" is the one Celery publishes to: ``broker_write_url`` when it is set,
else ``broker_url``. A failover list (``redis://a;redis://b``, or a list) or any URL that
is not plain ``redis://``/``rediss://`` (``sentinel://``, say) may publish to a server
other than the one it names: it takes the two-step path. The push hook checks once more
against the connection that really publishes (a ``connection=`` or ``producer=`` the
caller passed may go elsewhere): on another server it reserves in the store first and
then pushes, the two-step path inside the publish, so the reservation and the
``published`` event always land where the store looks.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast
from urllib.parse import urlsplit

from conventions.store.records import AuditEvent
from conventions.store.redis import RedisStore
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
    if not (transport == broker.INBOX_TRANSPORT or transport is broker.Transport):
        return False
    written = conf.get("broker_write_url") or conf.get("broker_url")
    if not isinstance(written, str) or ";" in written:  # a failover list: in doubt
        return False
    url = urlsplit(written)
    if url.scheme not in ("redis", "rediss"):
        return False
    return store.shares_server(url.hostname, url.port or 6379)


def _publishes_to_store(store: RedisStore, client: Any) -> bool:
    """Whether ``client`` (the connection that publishes) talks to the store's server."""
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
) -> broker.PushHook:
    """The push of ``task_id``'s message with its reservation, which keeps the payload's
    ``fingerprint`` (``key=None``: the audit event only, for a task without enqueue
    dedup)."""

    redis_store = cast(RedisStore, store)  # eligible() checked it

    def push(client: Any, queue_list: str, message: str) -> None:
        if not _publishes_to_store(redis_store, client):
            _reserve_then_push(
                redis_store, client, queue_list, message, key, task_id, ttl, audit, fingerprint
            )
            return
        holder = redis_store.reserve_and_push(
            client, queue_list, message, key, task_id, ttl, audit, fingerprint
        )
        if holder is not None:
            raise Deduplicated(holder)

    return broker.PushHook(task_id, push)


def _reserve_then_push(  # noqa: PLR0917
    store: RedisStore,
    client: Any,
    queue_list: str,
    message: str,
    key: str | None,
    task_id: str,
    ttl: float | None,
    audit: AuditEvent,
    fingerprint: str | None,
) -> None:
    """The two-step path, for a connection that publishes to another server: the
    reservation (or, without one, the audit event after the push) in the store, then
    kombu's own ``LPUSH`` on the publishing connection. A retried publish runs it again:
    the reservation is already this job's, and records nothing twice."""
    if key is not None:
        holder = store.reserve(key, task_id, ttl, audit=audit, fingerprint=fingerprint)
        if holder is not None:
            raise Deduplicated(holder)
    client.lpush(queue_list, message)
    if key is None:
        store.add_audit(audit)


def forget(app: Any, task_id: str) -> None:
    """Drop the result subscription Celery made for a publish that was deduplicated."""
    consumer = getattr(app.backend, "result_consumer", None)
    cancel = getattr(consumer, "cancel_for", None)
    if cancel is not None:
        with contextlib.suppress(Exception):  # never let a cleanup hide the answer
            cancel(task_id)

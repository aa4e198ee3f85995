"""Where the demo runs: the broker and store it picks, as environment for every process.

``REDIS_URL``/``CELERY_BROKER_URL`` when set (RabbitMQ too: ``CELERY_BROKER_URL=amqp://...``);
else a Redis on localhost:6379 when one answers (databases ``DEMO_REDIS_DBS``, default
``3,4``: the broker and results, then the layer's store, both emptied first); else the
embedded default (Celery's filesystem transport and SQLite under ``.demo/``).
``--embedded`` skips the Redis look.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".demo"
#: the Redis databases used when the demo finds a Redis on localhost
DEFAULT_REDIS_DBS = (3, 4)
#: the doctor refuses to start a worker on a Redis without persistence; the demo's Redis
#: is a throwaway one (emptied first), so the demo lowers that check to a warning, and says so
LOWERED_CHECK = "redis-no-persistence=warning"


@dataclass
class Place:
    """The choice, said in words, and the environment every process of the demo gets."""

    where: str
    env: dict[str, str]
    #: True when the broker is Redis (queue ages, metrics and Flower work)
    redis: bool
    #: ``redis``, ``amqp`` (RabbitMQ) or ``embedded``
    broker: str = "redis"
    #: what the demo changed about the doctor's levels, said in words ("" for nothing)
    lowered: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def observable(self) -> bool:
        """The queues can be read (Redis lists, or RabbitMQ's passive declare): the
        queues view, the exporter and the queue samples run."""
        return self.broker in ("redis", "amqp")


def redis_dbs(text: str | None) -> tuple[int, int]:
    """``"2,3"`` -> (2, 3): the broker's database, then the store's (they must differ)."""
    if not text:
        return DEFAULT_REDIS_DBS
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or parts[0] == parts[1]:
        raise SystemExit(f"DEMO_REDIS_DBS={text!r}: give two different numbers, e.g. 2,3")
    return int(parts[0]), int(parts[1])


def _local_redis(dbs: tuple[int, int]) -> bool:
    """A Redis answers on localhost:6379: empty the demo's two databases and say yes."""
    try:
        import redis

        for db in dbs:
            client = redis.Redis(host="127.0.0.1", port=6379, db=db, socket_connect_timeout=0.5)
            try:
                client.flushdb()
            finally:
                client.close()
    except Exception:
        return False
    return True


def choose(embedded: bool = False) -> Place:
    """Which broker and store the demo runs on (see the module's docstring)."""
    env: dict[str, str] = {
        "CONVENTIONS_DATA_DIR": str(DATA),
        "DATABASE_URL": os.environ.get("DATABASE_URL") or f"sqlite:///{DATA / 'shop.sqlite3'}",
    }
    sqlite_store = f"sqlite:///{DATA / 'store.sqlite3'}"
    given = (
        None if embedded else (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL"))
    )
    if given:
        env["CONVENTIONS_STORE_URL"] = os.environ.get("CONVENTIONS_STORE_URL", sqlite_store)
        redis = given.startswith(("redis://", "rediss://"))
        amqp = given.startswith(("amqp://", "amqps://", "pyamqp://"))
        kind = "RabbitMQ, " if amqp else ""
        where = f"the broker you configured ({kind}{given.split('@')[-1]})"
        broker = "redis" if redis else "amqp" if amqp else "embedded"
        if amqp:
            env["CELERY_BROKER_URL"] = given
        if redis:  # the next steps name it (the processes inherit it anyway)
            env.setdefault("REDIS_URL", given)
        place = Place(where, env, redis, broker)
        return _lower_persistence_check(place) if redis else place
    dbs = redis_dbs(os.environ.get("DEMO_REDIS_DBS"))
    if not embedded and _local_redis(dbs):
        env["REDIS_URL"] = f"redis://127.0.0.1:6379/{dbs[0]}"
        store = os.environ.get("CONVENTIONS_STORE_URL")  # a store of yours (a cluster's)
        env["CONVENTIONS_STORE_URL"] = store or f"redis://127.0.0.1:6379/{dbs[1]}"
        where = f"Redis on localhost:6379 (databases {dbs[0]} and {dbs[1]})"
        if store:
            where = f"Redis on localhost:6379 (database {dbs[0]}), the store you configured"
        return _lower_persistence_check(Place(where, env, True))
    env["CELERY_BROKER_URL"] = "filesystem://"
    env["CONVENTIONS_STORE_URL"] = sqlite_store
    where = "the embedded default: Celery's filesystem transport + SQLite in .demo/"
    return Place(where, env, False, "embedded")


def _lower_persistence_check(place: Place) -> Place:
    """Lower ``redis-no-persistence`` to a warning for every process of the demo (levels
    given in ``CONVENTIONS_DOCTOR_LEVELS`` come after, so they still win)."""
    given = os.environ.get("CONVENTIONS_DOCTOR_LEVELS", "")
    place.env["CONVENTIONS_DOCTOR_LEVELS"] = ",".join(filter(None, [LOWERED_CHECK, given]))
    place.lowered = (
        "the doctor's redis-no-persistence check is lowered to a warning for this run "
        f"(CONVENTIONS_DOCTOR_LEVELS={LOWERED_CHECK}): the demo's Redis is a throwaway one; "
        "a real worker refuses to start on a Redis without AOF or RDB snapshots"
    )
    return place

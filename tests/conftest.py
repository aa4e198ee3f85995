"""Test environment: real Redis, PostgreSQL and RabbitMQ, isolated per test worker.

The environment is set here, before ``celeryconfig`` is imported. Each pytest-xdist
worker (:mod:`tests.isolation`) runs on a ``redis-server`` of its own (started by a
session fixture; ``TEST_REDIS_URL`` names a server to share instead), where the broker
and the store get their own database numbers; on a RabbitMQ vhost of its own
(``TEST_AMQP_URL`` names one to share instead); and the shop gets its own PostgreSQL
database (made lazily, so unit tests need neither). Without Redis or PostgreSQL a
laptop run skips the tests that need them; in CI (``CI`` set) it fails instead
(dramatiq's rule).
"""

from __future__ import annotations

import os
import uuid

from tests import isolation

#: whether this worker starts a redis-server of its own (no ``TEST_REDIS_URL`` given)
OWN_REDIS = "TEST_REDIS_URL" not in os.environ
REDIS_BASE = os.environ.get("TEST_REDIS_URL", f"redis://127.0.0.1:{isolation.REDIS_PORT}")
#: whether this worker makes a vhost of its own (no ``TEST_AMQP_URL`` given, or only the
#: one the xdist controller set, which its workers inherit); the RabbitMQ tests' apps and
#: the processes they start read ``TEST_AMQP_URL``
OWN_VHOST = "TEST_AMQP_URL" not in os.environ or os.environ.get("TEST_AMQP_URL_OWN") == "1"
if OWN_VHOST:
    os.environ["TEST_AMQP_URL"] = f"amqp://guest:guest@127.0.0.1:5672/{isolation.VHOST}"
    os.environ["TEST_AMQP_URL_OWN"] = "1"
BROKER_DB = int(os.environ.get("TEST_BROKER_DB", "10"))
STORE_DB = int(os.environ.get("TEST_STORE_DB", "11"))
PG_BASE = os.environ.get("TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432")
SHOP_DB = f"cc_shop_{uuid.uuid4().hex[:8]}"

os.environ.pop("CELERY_BROKER_URL", None)
os.environ.pop("CELERY_RESULT_BACKEND", None)
os.environ["REDIS_URL"] = f"{REDIS_BASE}/{BROKER_DB}"
os.environ["CONVENTIONS_STORE_URL"] = f"{REDIS_BASE}/{STORE_DB}"
os.environ["DATABASE_URL"] = f"{PG_BASE}/{SHOP_DB}"
os.environ["CONVENTIONS_LEASE_SECONDS"] = "3"
# some tests shorten the visibility timeout below the time limits on purpose (to force a
# redelivery): the doctor warns about it instead of refusing to start their workers; and
# the suite's Redis runs without persistence (scripts/services.sh: a throwaway server),
# which the doctor refuses for workers by default
os.environ["CONVENTIONS_DOCTOR_LEVELS"] = (
    "time-limit-beyond-visibility=warning,countdown-beyond-visibility=warning,"
    "redis-no-persistence=warning"
)
os.environ.pop("SMTP_URL", None)
os.environ.pop("SENTRY_DSN", None)

pytest_plugins = ["tests.fixtures"]

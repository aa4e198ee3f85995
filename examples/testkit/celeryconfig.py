"""The shop's Celery settings: the layer's reliable profile, read from the environment.

* ``SHOP_BROKER_URL``: the broker (default ``redis://localhost:6379/0``);
* ``SHOP_STORE_URL``: the result backend and the layer's store (default
  ``redis://localhost:6379/1``);
* ``SHOP_THROWAWAY_REDIS``: set for a Redis without persistence (a laptop): the worker
  starts with a warning instead of being refused.

The tests never reach these servers: the test kit points the app at an in-memory broker
and a store of each test's own (docs: "Test your jobs").
"""

from __future__ import annotations

import os

from conventions.config import profile

# private names: a module variable named like an old Celery setting (BROKER_URL)
# makes every worker warn that the old setting names are deprecated
_broker = os.environ.get("SHOP_BROKER_URL", "redis://localhost:6379/0")
_store = os.environ.get("SHOP_STORE_URL", "redis://localhost:6379/1")

globals().update(profile.reliable(broker_url=_broker, store_url=_store, result_backend=_store))
#: workloads -> queues
conventions_workloads = {"email": "email", "reports": "reports"}
#: the schedule beat sends (tasks/schedule.py)
conventions_schedule = "tasks.schedule:ENTRIES"

if os.environ.get("SHOP_THROWAWAY_REDIS"):
    conventions_doctor_levels = {"redis-no-persistence": "warning"}

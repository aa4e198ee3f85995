"""The example project's Celery settings: the layer's reliable profile, read from the
environment.

* ``EXAMPLE_BROKER_URL``: the broker (default ``redis://localhost:6379/0``);
* ``EXAMPLE_STORE_URL``: the result backend and the layer's store (default
  ``redis://localhost:6379/1``);
* ``EXAMPLE_THROWAWAY_REDIS``: set (to anything) for a Redis without persistence (tests,
  a laptop): the worker then starts with a warning instead of being refused.
"""

from __future__ import annotations

import os

from conventions.config import profile

# private names: a module variable named like an old Celery setting (BROKER_URL)
# makes every worker warn that the old setting names are deprecated
_broker = os.environ.get("EXAMPLE_BROKER_URL", "redis://localhost:6379/0")
_store = os.environ.get("EXAMPLE_STORE_URL", "redis://localhost:6379/1")
#: workloads -> queues
WORKLOADS = {"default": "example"}

# every setting the layer's promises rest on (late acks, the inbox transport, bounded
# publishes, ...): see docs/howto/adopt.md
globals().update(profile.reliable(broker_url=_broker, store_url=_store, result_backend=_store))
# the project's own: its workloads (the app declares their queues and routes)
conventions_workloads = WORKLOADS

if os.environ.get("EXAMPLE_THROWAWAY_REDIS"):
    # losing the queues on a restart is fine here: the doctor warns instead of refusing
    conventions_doctor_levels = {"redis-no-persistence": "warning"}

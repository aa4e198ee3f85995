"""The fleet project's Celery settings: the layer's reliable profile, servers from the
environment (the mixed-fleet test gives each run its own).

* ``FLEET_BROKER_URL``: a ``redis://`` or ``amqp://`` broker;
* ``FLEET_STORE_URL``: the layer's store and the result backend (Redis);
* ``FLEET_RECOVERY_TIMEOUT``: seconds before a worker that died whole has its jobs given
  back (short in the test, so that a killed worker's jobs come back within the run).
"""

from __future__ import annotations

import os

from conventions.config import profile

_broker = os.environ["FLEET_BROKER_URL"]
_store = os.environ["FLEET_STORE_URL"]

globals().update(
    profile.reliable(
        broker_url=_broker,
        store_url=_store,
        result_backend=_store,
        recovery_timeout=float(os.environ.get("FLEET_RECOVERY_TIMEOUT") or 30),
    )
)
task_default_queue = "fleet_default"
conventions_workloads = {"payments": "fleet_payments"}
#: a killed holder's ledger key is free again this soon (seconds)
conventions_lease_seconds = 3.0

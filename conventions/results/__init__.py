"""Celery result backends whose writes carry the layer's ledger steps.

``conventions.results.redis`` holds ``RedisBackend`` and ``SentinelBackend``: Celery's
own Redis and Sentinel backends, with the claim and the completion of a convention job
riding their STARTED and SUCCESS writes (see that module).
"""

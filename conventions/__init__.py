"""celery-conventions: a thin, opinionated convention layer over Celery.

Declare a task once, with a versioned name, an id-only payload, an idempotency key
template and a workload; the layer validates before publishing and again in the worker,
deduplicates, retries with backoff and jitter, dead-letters what fails for good, and
carries correlation ids through every job.
"""

from __future__ import annotations

from conventions.app import App
from conventions.errors import (
    BackendUnavailable,
    ConfigurationError,
    ConventionsError,
    PayloadError,
    PermanentError,
    SkipJob,
    TransientError,
    UncertainOutcomeError,
    Unroutable,
)
from conventions.jobs.backoff import Backoff
from conventions.jobs.contract import Contract
from conventions.jobs.payloads import Id, Payload, sensitive
from conventions.task import ConventionTask, DuplicateResult
from conventions.tracing.context import bind
from conventions.worker.job_context import JobContext

__all__ = [
    "App",
    "BackendUnavailable",
    "Backoff",
    "ConfigurationError",
    "Contract",
    "ConventionTask",
    "ConventionsError",
    "DuplicateResult",
    "Id",
    "JobContext",
    "Payload",
    "PayloadError",
    "PermanentError",
    "SkipJob",
    "TransientError",
    "UncertainOutcomeError",
    "Unroutable",
    "bind",
    "sensitive",
]

__version__ = "0.2.0.dev0"

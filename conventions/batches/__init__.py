"""Batches: N convention jobs and callbacks that run once, after every member has ended.

:mod:`conventions.batches.declare` is what ``app.batch(...)`` makes and submits;
:mod:`conventions.batches.callbacks` publishes the callbacks (and sweeps the ones a crash
left due); the state lives in the store (:mod:`conventions.store.batches`).
"""

from __future__ import annotations

from conventions.batches.declare import Batch, Submitted

__all__ = ["Batch", "Submitted"]

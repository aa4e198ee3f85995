"""A small FastAPI shop front for the correlation acceptance test (served by uvicorn).

``POST /orders/{order_id}`` logs a line and publishes the flaky fan-out job; its logs are
JSON lines on stdout, like a deployed web process shipping its logs.
"""

from __future__ import annotations

import logging
import sys

from fastapi import FastAPI

from conventions.contrib.web import ASGIMiddleware
from conventions.tracing import logs
from tests.integration.support_tracing import flaky_fanout

_handler = logging.StreamHandler(sys.stdout)
_handler.setFormatter(logs.formatter("json"))
logger = logging.getLogger("shop.web")
logger.addHandler(_handler)
logger.setLevel(logging.INFO)

api = FastAPI()
api.add_middleware(ASGIMiddleware)


@api.post("/orders/{order_id}")
def place_order(order_id: str) -> dict[str, str]:
    logger.info("order %s accepted", order_id)
    result = flaky_fanout.delay(order_id=order_id)
    return {"task_id": str(result.id)}

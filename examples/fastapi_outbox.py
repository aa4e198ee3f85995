"""A FastAPI checkout that enqueues the receipt through the outbox (a tested example).

``POST /orders`` creates the order and adds ``email.send_receipt.v2`` in ONE transaction
of the shop database: either both commit or neither does. The relay publishes the job::

    uvicorn examples.fastapi_outbox:api --port 8000      # the web app
    conventions outbox relay                              # the relay
    celery -A tasks worker -Q email                       # a worker

Each request binds a correlation context (``conventions.contrib.web.ASGIMiddleware``: the
client's ``X-Correlation-ID`` / ``X-Request-ID`` when well-formed), so the job carries the
request's correlation id, exactly as ``.delay()`` would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError

from conventions.contrib.web import ASGIMiddleware
from conventions.transactional import outbox
from tasks import db, shop
from tasks.receipts import send_receipt


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    outbox.create_table(db.engine())  # in production: a migration
    yield


api = FastAPI(title="shop checkout", lifespan=lifespan)
api.add_middleware(ASGIMiddleware)


class NewOrder(BaseModel):
    order_id: str = Field(pattern=r"^ord_[A-Za-z0-9_]+$", max_length=32)
    customer_id: str = Field(max_length=32)
    amount_minor: int = Field(gt=0)
    currency: str = Field(default="EUR", min_length=3, max_length=3)


class Created(BaseModel):
    order_id: str
    receipt_job: str


@api.post("/orders", status_code=201)
def create_order(new: NewOrder) -> Created:
    """Create a paid order and add its receipt job, in one transaction."""
    try:
        with db.transaction() as session:
            session.add(
                shop.Order(
                    id=new.order_id,
                    customer_id=new.customer_id,
                    amount_minor=new.amount_minor,
                    currency=new.currency,
                    status=shop.PAID,
                    paid_minor=new.amount_minor,
                )
            )
            job = outbox.add(session, send_receipt, order_id=new.order_id)
    except IntegrityError as exc:  # a known order id, an unknown customer: nothing is kept
        raise HTTPException(409, "order exists or customer unknown") from exc
    return Created(order_id=new.order_id, receipt_job=job)

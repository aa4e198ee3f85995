"""A test-only app on RabbitMQ (``amqp://``), for the queues view, the exporter and
backpressure there. Its store is the run's Redis store database; its queues are
``q25_``-prefixed and deleted by the tests that declare them.
"""

from __future__ import annotations

import os

from conventions import App, Id, JobContext, Payload

#: the RabbitMQ the tests run against (guest/guest on this machine and in CI)
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: the queues of the app: one for the view, one bounded, and the default (never declared)
VIEW, BOUNDED, DEFAULT = "q25_view", "q25_bounded", "q25_default"

app = App("q25_rabbit", set_as_current=False)
app.conf.update(
    broker_url=AMQP_URL,
    broker_connection_timeout=5.0,
    conventions_store_url=os.environ["CONVENTIONS_STORE_URL"],
    conventions_workloads={"view": VIEW, "bounded": BOUNDED},
    task_default_queue=DEFAULT,
    task_serializer="json",
    accept_content=["json"],
)


class Item(Payload):
    item_id: Id


@app.job("testing.q25_viewed.v1", payload=Item, key="q25v:{item_id}", workload="view")
def viewed(payload: Item, ctx: JobContext) -> str:
    return payload.item_id


@app.job("testing.q25_bounded.v1", payload=Item, key="q25b:{item_id}", workload="bounded")
def bounded(payload: Item, ctx: JobContext) -> str:
    return payload.item_id


#: the same app with a RabbitMQ that does not answer (nothing listens on port 1)
unreachable = App("q25_unreachable", set_as_current=False)
unreachable.conf.update(
    {key: app.conf[key] for key in ("conventions_store_url", "conventions_workloads")},
    broker_url="amqp://guest:guest@127.0.0.1:1//",
    broker_connection_timeout=1.0,
)

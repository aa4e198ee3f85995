"""The console's queues page on RabbitMQ (``amqp://``): the depth and consumers the
broker counts, the oldest job's age shown unknown (``-``), never made up.

It uses the RabbitMQ test app of ``support_rabbit`` (``q25_``-prefixed queues, deleted
before and after) through httpx's ASGI transport: the page is the same code whatever
serves it (the browser tests serve it with uvicorn, on Redis).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
from kombu import Connection

from conventions.console import Principal, Role, console_app
from tests.fixtures import unavailable
from tests.integration import support_rabbit as rabbit


def _reset(connection: Connection) -> None:
    assert rabbit.app.amqp is not None  # builds the workloads' queues on the app
    channel = connection.channel()
    for queue in rabbit.app.conf.task_queues:
        channel.queue_delete(queue.name)
    channel.close()


@pytest.fixture
def amqp(store_redis: redis.Redis) -> Iterator[Connection]:
    """RabbitMQ with the app's queues declared afresh (and deleted after)."""
    connection = Connection(rabbit.AMQP_URL, connect_timeout=5)
    try:
        connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable("RabbitMQ", exc)
    _reset(connection)
    for queue in rabbit.app.conf.task_queues:
        if queue.name == rabbit.VIEW:
            queue(connection.channel()).declare()
    yield connection
    _reset(connection)
    connection.release()


def test_the_queues_page_shows_rabbitmqs_depth_and_an_unknown_age(amqp: Connection) -> None:
    run = uuid.uuid4().hex[:8]
    for n in range(3):
        rabbit.viewed.delay(item_id=f"c{run}{n}")
    web = console_app(rabbit.app, authorizer=lambda _: Principal("ops:ana", Role.READ_ONLY))

    async def read() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/queues.json"), await c.get("/queues")

    found, page = asyncio.run(read())
    rows = {row["queue"]: row for row in found.json()["queues"]}
    view = rows[rabbit.VIEW]
    assert (view["depth"], view["consumers"], view["age_source"]) == (3, 0, "unknown")
    assert view["oldest_age"] is None and view["late"] is False
    assert rows[rabbit.BOUNDED]["age_source"] == "not-declared"
    assert page.status_code == 200
    # the queue's row of the table (its name is in the charts' legends too)
    row = page.text.split(f'<tr data-queue="{rabbit.VIEW}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-field="oldest_age">-<' in row and 'data-field="depth">3<' in row

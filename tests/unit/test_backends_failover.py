"""Which backend did not answer, when the broker is a failover list of nodes."""

from __future__ import annotations

from types import SimpleNamespace

from conventions.cli import backends
from conventions.config.settings import failover_urls

NODES = "amqp://app:pw@rabbit-a:5672/prod;amqp://app:pw@rabbit-b:5672/prod"


def test_a_failover_list_is_each_of_its_urls_in_order() -> None:
    assert failover_urls(NODES + ";") == [
        "amqp://app:pw@rabbit-a:5672/prod", "amqp://app:pw@rabbit-b:5672/prod",
    ]  # fmt: skip
    assert failover_urls(["amqp://a//", "amqp://b//"]) == ["amqp://a//", "amqp://b//"]
    assert failover_urls(None) == []


def test_an_error_naming_the_second_node_of_the_list_is_the_brokers() -> None:
    app = SimpleNamespace(conf={
        "broker_url": NODES, "result_backend": "redis://results:6379/0",
        "conventions_store_url": "redis://store:6379/1",
    })  # fmt: skip
    exc = ConnectionRefusedError("[Errno 111] connect to rabbit-b:5672 refused")
    said = backends.describe(exc, app)
    assert said.startswith("the broker (amqp://app:"), said
    assert "rabbit-b:5672" in said and "pw" not in said

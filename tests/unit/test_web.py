"""The middleware binds one correlation context per request, in each framework.

Each test runs the real framework (Flask's test client, Django's test client, a FastAPI
app driven through the ASGI interface); the view answers what ``.delay()`` would see.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conventions.contrib import web
from conventions.tracing import context


def seen() -> dict[str, Any]:
    trace = context.current()
    assert trace is not None
    return {
        "correlation": trace.correlation_id,
        "request": trace.request_id,
        "causation": trace.causation_id,
        "actor": trace.actor_id,
    }


# -- Flask (WSGI) ---------------------------------------------------------------------------
@pytest.fixture
def flask_client() -> Any:
    import flask

    app = flask.Flask("shop")
    app.add_url_rule("/orders", "orders", lambda: flask.jsonify(seen()), methods=["POST"])
    app.wsgi_app = web.WSGIMiddleware(app.wsgi_app, actor=lambda environ: "user-7")  # type: ignore[method-assign]
    return app.test_client()


def test_flask_a_request_without_ids_gets_new_ones_echoed_in_the_response(
    flask_client: Any,
) -> None:
    response = flask_client.post("/orders")
    body = response.get_json()
    assert response.headers["X-Correlation-ID"] == body["correlation"]
    assert response.headers["X-Request-ID"] == body["request"]
    assert body["causation"] == f"request:{body['request']}"
    assert body["actor"] == "user-7"
    assert context.current() is None


def test_flask_a_well_formed_incoming_correlation_id_is_kept(flask_client: Any) -> None:
    response = flask_client.post("/orders", headers={"X-Correlation-ID": "checkout-42"})
    assert response.get_json()["correlation"] == "checkout-42"


def test_flask_a_malformed_incoming_id_is_replaced(flask_client: Any) -> None:
    response = flask_client.post("/orders", headers={"X-Correlation-ID": "bad id <script>"})
    assert response.get_json()["correlation"] != "bad id <script>"
    assert len(response.get_json()["correlation"]) == 32


# -- Django -----------------------------------------------------------------------------------
def django_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse(seen())


urlpatterns: list[Any] = []


@pytest.fixture(scope="module")
def django_client() -> Any:
    """The Django example's settings (one settings module per process), this module's URLs."""
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_outbox.settings")
    import django
    from django.test import Client, override_settings
    from django.urls import path

    django.setup()
    urlpatterns[:] = [path("orders", django_view)]
    with override_settings(
        ROOT_URLCONF=__name__, MIDDLEWARE=["conventions.contrib.web.DjangoMiddleware"]
    ):
        yield Client()


def test_django_a_request_is_bound_and_its_ids_echoed(django_client: Any) -> None:
    response = django_client.post("/orders", headers={"X-Request-ID": "req-9"})
    body = response.json()
    assert body["request"] == "req-9"
    assert body["causation"] == "request:req-9"
    assert response.headers["X-Correlation-ID"] == body["correlation"]
    assert context.current() is None


# -- FastAPI (ASGI) ---------------------------------------------------------------------------
def call_asgi(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/orders", "raw_path": b"/orders", "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_fastapi_sync_and_async_endpoints_both_see_the_requests_context() -> None:
    import json

    import fastapi

    app = fastapi.FastAPI()
    app.add_api_route("/orders", seen, methods=["POST"])  # sync: a threadpool
    app.add_middleware(web.ASGIMiddleware)
    headers, body = call_asgi(app, [(b"x-correlation-id", b"corr-77")])
    data = json.loads(body)
    assert data["correlation"] == "corr-77"
    assert headers["x-correlation-id"] == "corr-77"
    assert headers["x-request-id"] == data["request"]

"""The demo's web shop: a plain WSGI app behind :class:`conventions.contrib.web.WSGIMiddleware`.

``python -m demo.webapp --port-file F`` serves on a free port of 127.0.0.1 (written to
``F``), one thread per request:

* ``POST /orders`` ``{"order_id", "customer_id", "amount_minor"}``: the checkout. The
  order (paid by card at checkout) and its receipt job are written in ONE transaction of
  the shop database, the job as an outbox row (:mod:`conventions.transactional.outbox`); the relay
  publishes it. 201 ``{"order_id", "receipt_job"}``.
* ``POST /webhooks/payments`` ``{"event_id"}``: a payment provider's webhook. There is
  no transaction to join, so it calls ``apply_event.delay()``: a duplicate delivery
  returns the first job (``"deduplicated": true``). 202 ``{"job", "deduplicated"}``.
* ``GET /health``: 200.

A call the payload rules refuse answers 400 with the reason, and nothing is enqueued.
Every response carries ``X-Correlation-ID``: the id under which ``conventions trace``
finds what the request caused.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy.exc import IntegrityError

from conventions import PayloadError
from conventions.contrib.web import WSGIMiddleware
from conventions.tracing import logs
from conventions.transactional import outbox
from tasks import db, shop
from tasks.payments import apply_event
from tasks.receipts import send_receipt

logger = logging.getLogger("demo.webapp")
Reply = tuple[str, dict[str, Any]]


def place_order(body: dict[str, Any]) -> Reply:
    """The order and its receipt job commit together, or neither does."""
    try:
        with db.transaction() as session:
            session.add(
                shop.Order(
                    id=str(body["order_id"]),
                    customer_id=str(body["customer_id"]),
                    amount_minor=int(body["amount_minor"]),
                    currency=shop.DEFAULT_CURRENCY,
                    status=shop.PAID,
                    paid_minor=int(body["amount_minor"]),
                )
            )
            job = outbox.add(session, send_receipt, order_id=str(body["order_id"]))
    except IntegrityError:
        return "409 Conflict", {"error": "order exists or customer unknown"}
    logger.info("order %s placed; receipt job %s is in the outbox", body["order_id"], job)
    return "201 Created", {"order_id": body["order_id"], "receipt_job": job}


def payment_webhook(body: dict[str, Any]) -> Reply:
    """Enqueue the event's job; a re-delivered webhook publishes nothing new."""
    result = apply_event.delay(event_id=body.get("event_id"))
    duplicate = bool(getattr(result, "deduplicated", False))
    logger.info(
        "webhook %s: job %s%s",
        body.get("event_id"),
        result.id,
        " (duplicate absorbed)" if duplicate else "",
    )
    return "202 Accepted", {"job": result.id, "deduplicated": duplicate}


ROUTES: dict[tuple[str, str], Callable[[dict[str, Any]], Reply]] = {
    ("POST", "/orders"): place_order,
    ("POST", "/webhooks/payments"): payment_webhook,
    ("GET", "/health"): lambda _: ("200 OK", {"ok": True}),
}


def shop_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The routes above, JSON in and out."""
    route = ROUTES.get((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
    if route is None:
        status, data = "404 Not Found", {"error": "no such route"}
    else:
        size = int(environ.get("CONTENT_LENGTH") or 0)
        try:
            body = json.loads(environ["wsgi.input"].read(size) or b"{}")
            status, data = route(body)
        except (PayloadError, ValueError, KeyError, TypeError) as exc:
            logger.warning("refused: %s", exc)
            status, data = "400 Bad Request", {"error": str(exc)}
    payload = json.dumps(data).encode()
    start_response(status, [("Content-Type", "application/json")])
    return [payload]


#: the app as served: each request binds its correlation context (X-User-ID: the actor)
app = WSGIMiddleware(shop_app, actor=lambda environ: environ.get("HTTP_X_USER_ID"))


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), format % args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.webapp", description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text")
    args = parser.parse_args(argv)
    logs.install()
    handler = logging.StreamHandler()
    handler.setFormatter(logs.formatter(args.log_format))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    with db.transaction():  # the schema, before the first request
        outbox.create_table(db.engine())
    server = make_server("127.0.0.1", 0, app, ThreadingServer, QuietHandler)
    args.port_file.with_suffix(".tmp").write_text(str(server.server_port))
    args.port_file.with_suffix(".tmp").replace(args.port_file)
    logger.info("shop web app on http://127.0.0.1:%s", server.server_port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

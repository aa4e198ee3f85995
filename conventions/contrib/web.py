"""Bind the correlation context per web request: ASGI, WSGI (Flask) and Django.

Each request gets a correlation id (the caller's ``X-Correlation-ID`` when it is a
well-formed id, else a new one) and a request id (``X-Request-ID``, likewise); both are
echoed in the response. Every ``.delay()`` made while the request is handled carries
them, every log record carries them (:mod:`conventions.tracing.logs`), and Sentry events of the
request are tagged with the correlation id.

- FastAPI / Starlette / any ASGI app: ``app.add_middleware(ASGIMiddleware)`` or
  ``ASGIMiddleware(app)``.
- Flask / any WSGI app: ``app.wsgi_app = WSGIMiddleware(app.wsgi_app)``.
- Django: ``"conventions.contrib.web.DjangoMiddleware"`` in ``MIDDLEWARE``, after
  ``AuthenticationMiddleware`` (the default ``actor`` reads ``request.user``).
- Anything else: ``with conventions.bind(...):``.

``actor`` (optional, each middleware) is a callable of the framework's request object
(the ASGI scope, the WSGI environ, the Django request) that returns who acts: a user id,
never a name or an e-mail. None of these import a web framework.

A streamed WSGI response body is produced after the middleware returns: publishes made
while it streams are outside the request's context (bind one in the generator).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import Any, Final

from conventions.observability import alerts
from conventions.tracing import context

CORRELATION_HEADER: Final = "X-Correlation-ID"
REQUEST_HEADER: Final = "X-Request-ID"
#: an incoming id is kept only when it looks like an id (no injection into logs)
_WELL_FORMED = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Actor = Callable[[Any], "str | None"]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def well_formed(value: str | None) -> str | None:
    """``value`` when it is a usable id, else None (a new one is made)."""
    return value if value and _WELL_FORMED.match(value) else None


@contextlib.contextmanager
def request_context(
    correlation_id: str | None, request_id: str | None, actor_id: str | None
) -> Iterator[context.Trace]:
    """Bind the context of one request (ids checked) and tag Sentry's request scope."""
    with context.bind(
        correlation_id=well_formed(correlation_id),
        request_id=well_formed(request_id),
        actor_id=actor_id,
    ) as trace:
        sentry = alerts.active_sentry()  # never imports sentry_sdk itself
        if sentry is not None:
            sentry.set_tag("correlation_id", trace.correlation_id)
        yield trace


def response_headers(trace: context.Trace) -> list[tuple[str, str]]:
    return [(CORRELATION_HEADER, trace.correlation_id), (REQUEST_HEADER, trace.request_id or "")]


class ASGIMiddleware:
    """Binds the context around each HTTP request of an ASGI app."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, actor: Actor | None = None
    ) -> None:
        self.app = app
        self.actor = actor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers") or ()
        }
        with request_context(
            headers.get(CORRELATION_HEADER.lower()),
            headers.get(REQUEST_HEADER.lower()),
            self.actor(scope) if self.actor else None,
        ) as trace:

            async def send_with_ids(message: MutableMapping[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    extra = [
                        (k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in response_headers(trace)
                    ]
                    message["headers"] = [*message.get("headers", ()), *extra]
                await send(message)

            await self.app(scope, receive, send_with_ids)


class WSGIMiddleware:
    """Binds the context around each request of a WSGI app (Flask: wrap ``wsgi_app``)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], *, actor: Actor | None = None) -> None:
        self.app = app
        self.actor = actor

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        with request_context(
            environ.get("HTTP_X_CORRELATION_ID"),
            environ.get("HTTP_X_REQUEST_ID"),
            self.actor(environ) if self.actor else None,
        ) as trace:

            def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                return start_response(status, [*headers, *response_headers(trace)], exc_info)

            return self.app(environ, start)


class DjangoMiddleware:
    """Django middleware (synchronous): ``"conventions.contrib.web.DjangoMiddleware"``.

    An ``actor`` is given by subclassing: ``def actor(self, request): return ...``.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def actor(self, request: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            return str(user.pk)
        return None

    def __call__(self, request: Any) -> Any:
        with request_context(
            request.headers.get(CORRELATION_HEADER),
            request.headers.get(REQUEST_HEADER),
            self.actor(request),
        ) as trace:
            response = self.get_response(request)
        for name, value in response_headers(trace):
            response[name] = value
        return response

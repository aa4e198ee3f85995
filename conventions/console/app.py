"""``console_app``: the console as an ASGI app (Starlette), ready to mount or serve.

    from conventions.console import Principal, Role, console_app

    def authorizer(request):            # the host app's own login decides
        user = request.scope.get("user")
        return Principal(user.email, Role.OPERATOR) if user else None

    fastapi_app.mount("/ops", console_app(app, authorizer=authorizer))

Without an authorizer the console refuses to be built, unless ``insecure_local=True``:
then every client on this machine is an admin named after the OS user, and any other
client is refused (``conventions web --insecure-local``, for a developer's laptop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conventions.config.extras import require

require("starlette", "console", "the operator's console")
require("jinja2", "console", "the operator's console")

from starlette.applications import Starlette  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import PlainTextResponse, RedirectResponse, Response  # noqa: E402
from starlette.routing import BaseRoute, Mount, Route  # noqa: E402
from starlette.staticfiles import StaticFiles  # noqa: E402
from starlette.templating import Jinja2Templates  # noqa: E402
from starlette.types import ASGIApp, Message, Receive, Scope, Send  # noqa: E402

from conventions.console import auth, csrf  # noqa: E402
from conventions.console.context import Console, Refused, base_path, render  # noqa: E402
from conventions.console.context import require as allowed  # noqa: E402
from conventions.console.pages import (  # noqa: E402
    batches,
    deadletters,
    queues,
    runs,
    schedules,
    trace,
)
from conventions.errors import ConfigurationError, NewerFormat  # noqa: E402
from conventions.store import key_forms  # noqa: E402

HERE = Path(__file__).resolve().parent
#: what every response says to the browser: no framing, scripts and styles of ours only
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; form-action 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every HTTP response of the console."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _home(request: Request) -> Response:
    await allowed(request, "view")  # every route asks the authorizer, this one too
    return RedirectResponse(f"{base_path(request)}/queues", status_code=303)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return render(request, None, "error.html", {"message": exc.message}, status=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """The router's own refusals (404 no such page, 405 wrong method) as error pages."""
    assert isinstance(exc, HTTPException)
    message = {404: "no such page in the console", 405: "this page does not take that method"}
    text = message.get(exc.status_code, str(exc.detail))
    return render(request, None, "error.html", {"message": text}, status=exc.status_code)


async def _newer(request: Request, exc: Exception) -> Response:
    """A record written by a newer release of the layer: said on the page, never misread
    (``conventions.config.formats``)."""
    return render(request, None, "error.html", {"message": str(exc)}, status=409)


async def _crashed(request: Request, exc: Exception) -> Response:
    """An unexpected exception: a 500 that still carries the security headers.

    Starlette answers it from its outermost middleware, outside ``SecurityHeaders``, so
    the headers are set here; the exception itself goes on to the server's log."""
    return PlainTextResponse(
        "the console failed on this request; its log says why",
        status_code=500,
        headers={name.decode(): value.decode() for name, value in SECURITY_HEADERS},
    )


def routes() -> list[BaseRoute]:
    """Every route of the console (the static files included)."""
    return [
        Route("/", _home, name="home"),
        *queues.ROUTES,
        *runs.ROUTES,
        *deadletters.ROUTES,
        *trace.ROUTES,
        *schedules.ROUTES,
        *batches.ROUTES,
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


def console_app(
    app: Any,
    *,
    authorizer: auth.Authorizer | None = None,
    insecure_local: bool = False,
    secret: bytes | str | None = None,
    title: str = "conventions",
    refresh_seconds: float = 5.0,
) -> Starlette:
    """The console of ``app`` (a ``conventions.App``) as an ASGI app.

    ``authorizer`` gives each request's principal (see ``conventions.console.auth``);
    ``secret`` signs the CSRF tokens (give the same one to every process serving the
    console behind one address; default: the app's ``conventions_console_secret``
    setting, else random per process: ``console.shared_secret`` says which).
    """
    if authorizer is None:
        if not insecure_local:
            raise ConfigurationError(
                "console_app needs an authorizer (a callable of the request returning a "
                "Principal or None); for a console on this machine only, pass "
                "insecure_local=True (conventions web --insecure-local)"
            )
        authorizer = auth.local_admin
    templates = Jinja2Templates(directory=HERE / "templates")
    # a key in both forms: as the body sees it, as the store keeps it (conventions.store.key_forms)
    templates.env.globals["key_forms"] = key_forms.both
    console = Console(
        app=app,
        authorizer=authorizer,
        templates=templates,
        title=title,
        refresh_seconds=refresh_seconds,
    )
    try:
        shared = csrf.shared_secret(app.conf if hasattr(app, "conf") else None, secret)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    if shared is not None:
        console.secret, console.shared_secret = shared, True
    handlers = {
        Refused: _refused, HTTPException: _http_error, NewerFormat: _newer, Exception: _crashed,
    }  # fmt: skip
    web = Starlette(routes=routes(), exception_handlers=handlers)
    web.state.console = console
    web.add_middleware(SecurityHeaders)
    return web

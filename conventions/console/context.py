"""What every page of the console shares: the console's state, who asks, the forms.

A page handler calls :func:`require` (GET) or :func:`submitted` (POST) first: the
authorizer is asked on every request, the role checked for the page's action, and a
POST's CSRF token verified, before anything is read or changed. :func:`render` fills a
template with what the layout needs (the mount's base path, the principal, the token).
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from conventions.console import csrf
from conventions.console.auth import Authorizer, Principal
from conventions.console.rates import Rates

#: the largest form body the console reads (a selection of a few hundred ids)
MAX_FORM_BYTES = 64 * 1024
#: the pages of the layout's navigation, in order: (path, label)
NAV: tuple[tuple[str, str], ...] = (
    ("/queues", "Queues"),
    ("/runs", "Runs"),
    ("/dead-letters", "Dead letters"),
    ("/trace", "Trace"),
    ("/batches", "Batches"),
    ("/schedules", "Schedules"),
)


class Refused(Exception):
    """A request the console answers with an error page: the status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Console:
    """The state of one console: the layer's app, the authorizer, the signing secret."""

    app: Any
    authorizer: Authorizer
    templates: Jinja2Templates
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    #: is ``secret`` shared by every process of this console (given, or a setting), or
    #: this process's own random one (tokens hold for this process only)?
    shared_secret: bool = False
    title: str = "conventions"
    #: how often the live pages (queues) ask for a fresh reading, in seconds
    refresh_seconds: float = 5.0
    #: the last reading of the store's counters, for the queues' rates
    rates: Rates = field(default_factory=Rates)


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def base_path(request: Request) -> str:
    """The path the console is mounted at ('' at the root), for links and the cookie."""
    return str(request.scope.get("root_path", "")).rstrip("/")


async def principal(request: Request) -> Principal:
    """The authorizer's answer for this request; a 403 when it lets nobody in."""
    answer = console_of(request).authorizer(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        raise Refused(403, "the console's authorizer does not let you in")
    if not isinstance(answer, Principal):
        raise TypeError(f"a console authorizer must return a Principal or None, not {answer!r}")
    return answer


def _no_nul(fields: Mapping[str, Any], where: str) -> None:
    """A 400 for a NUL character in any field: no store keeps one (PostgreSQL refuses
    it), and no id, key or name of the layer holds one."""
    for name, value in fields.items():
        values = value if isinstance(value, list) else [value]
        if any("\x00" in str(v) for v in [name, *values]):
            raise Refused(400, f"{where} {str(name)[:40]!r} holds a NUL character")


async def require(request: Request, action: str) -> Principal:
    """The principal, when allowed ``action``; else a 403 naming the role needed."""
    who = await principal(request)
    if not who.may(action):
        raise Refused(403, f"{who.actor} ({who.role}) may not {action}: the role is too low")
    _no_nul(request.path_params, "the path's")
    _no_nul(dict(request.query_params.multi_items()), "the query's field")
    return who


async def form_body(request: Request, limit: int = MAX_FORM_BYTES) -> bytes:
    """The request's body, read only up to ``limit`` bytes: a 413 as soon as the declared
    ``Content-Length`` or the bytes received pass it (a chunked body has no length), so a
    huge POST never sits in the console's memory."""
    declared = request.headers.get("content-length", "")
    if declared:
        if not declared.isdigit():
            raise Refused(400, "the Content-Length header is not a number")
        if int(declared) > limit:
            raise Refused(413, f"form too large: over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"form too large: over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def submitted(request: Request, action: str) -> tuple[Principal, dict[str, list[str]]]:
    """A POST's principal and form fields, after its CSRF token and role are checked."""
    who = await principal(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "the console takes forms (application/x-www-form-urlencoded)")
    body = await form_body(request)
    form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    given = (form.get(csrf.FIELD) or [request.headers.get(csrf.HEADER, "")])[0]
    nonce = request.cookies.get(csrf.COOKIE)
    if not csrf.valid(console_of(request).secret, nonce, who.actor, given):
        raise Refused(403, "missing or invalid CSRF token: reload the page and try again")
    if not who.may(action):
        raise Refused(403, f"{who.actor} ({who.role}) may not {action}: the role is too low")
    _no_nul(form, "the form's field")
    return who, form


#: the last page a list serves: its records are read up to the page, so a page of
#: 2**63 would ask the store for a count it cannot take (a 500 from Redis)
MAX_PAGE = 10_000


def page_number(text: str) -> int:
    """A list's page number from the query (1 when absent or below 1); a 400 for
    anything else, and for a page past :data:`MAX_PAGE`."""
    try:
        number = int(text or "1")
    except ValueError as exc:
        raise Refused(400, f"page {text[:20]!r} is not a number") from exc
    if number > MAX_PAGE:
        raise Refused(400, f"page {text[:20]} is past the last page a list serves ({MAX_PAGE})")
    return max(number, 1)


def first(form: Mapping[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0].strip()


def render(
    request: Request,
    who: Principal | None,
    template: str,
    context: Mapping[str, Any],
    status: int = 200,
) -> Response:
    """``template`` with the layout's context; sets the CSRF cookie on a first visit."""
    console = console_of(request)
    nonce = request.cookies.get(csrf.COOKIE)
    fresh = not nonce
    nonce = nonce or csrf.new_nonce()
    values = {
        "base": base_path(request),
        "nav": NAV,
        "title": console.title,
        "who": who,
        "csrf_field": csrf.FIELD,
        "csrf_token": csrf.token(console.secret, nonce, who.actor) if who else "",
        **context,
    }
    response = console.templates.TemplateResponse(request, template, values, status_code=status)
    if fresh:
        response.set_cookie(
            csrf.COOKIE,
            nonce,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base_path(request) or "/",
        )
    return response

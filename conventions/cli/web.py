"""``conventions web``: serve the operator's console on its own (the ``console`` extra).

    conventions web [--host 127.0.0.1] [--port 8700] --authorizer MODULE:CALLABLE
    conventions web --insecure-local            # this machine only, you are admin

``--authorizer`` names the callable that gives each request its principal (an actor
and a role; see ``conventions.console.auth``). Without one the console is served only
with ``--insecure-local``, and then only on a loopback address, to clients on this
machine: anything else is refused before the server starts.

The CSRF tokens are signed with ``CONVENTIONS_CONSOLE_SECRET`` from the environment,
else the app's ``conventions_console_secret`` setting; with neither, with a random
secret of this process, and the command says so at start: several processes behind one
load balancer would then refuse each other's forms.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from conventions.cli.base import PORT, USAGE, Failure, command
from conventions.config.extras import require

#: the port ``conventions web`` listens on by default
DEFAULT_PORT = 8700
#: what ``conventions web`` says at start when its CSRF secret is its own
NO_SHARED_SECRET = (
    "web: no shared secret (CONVENTIONS_CONSOLE_SECRET or conventions_console_secret): "
    "this process signs its forms with a random secret of its own; when several console "
    "processes serve one address, a form served by one is refused by the others"
)


def check_bind(host: str, authorizer: str | None, insecure_local: bool, **_: object) -> None:
    """An authorizer, or ``--insecure-local`` on a loopback address: never neither."""
    from conventions.console.auth import is_loopback  # no web framework needed

    if authorizer and insecure_local:
        raise Failure("web: --authorizer and --insecure-local exclude each other", USAGE)
    if not authorizer and not insecure_local:
        raise Failure(
            "web: nothing is served without --authorizer MODULE:CALLABLE; for a console "
            "on this machine only, pass --insecure-local",
            USAGE,
        )
    if insecure_local and not is_loopback(host):
        raise Failure(
            f"web: --insecure-local serves loopback only, not --host {host}; give an "
            "--authorizer to serve other machines",
            USAGE,
        )


def load_authorizer(spec: str) -> Any:
    """``MODULE:CALLABLE`` -> the callable (a usage error when it is not one)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise Failure(f"web: --authorizer {spec!r}: expected MODULE:CALLABLE", USAGE)
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise Failure(f"web: --authorizer {spec!r}: {exc}", USAGE) from exc
    if not callable(found):
        raise Failure(f"web: --authorizer {spec!r} is not callable", USAGE)
    return found


@command("web", before=check_bind)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=PORT, default=DEFAULT_PORT, show_default=True)
@click.option(
    "--authorizer",
    metavar="MODULE:CALLABLE",
    help="CALLABLE(request) returns a conventions.console.Principal (actor, role) or None",
)
@click.option(
    "--insecure-local",
    is_flag=True,
    help="no authorizer: every client on this machine is admin (loopback only)",
)
@click.option("--root-path", default="", help="the path prefix a proxy serves it under")
def web_command(
    app: Any,
    *,
    host: str,
    port: int,
    authorizer: str | None,
    insecure_local: bool,
    root_path: str,
) -> int:
    """Serve the operator's console (until stopped)."""
    uvicorn = require("uvicorn", "console", "conventions web")
    from conventions.console import csrf
    from conventions.console.app import console_app
    from conventions.errors import ConfigurationError

    try:
        web = console_app(
            app,
            authorizer=load_authorizer(authorizer) if authorizer else None,
            insecure_local=insecure_local,
            secret=os.environ.get(csrf.ENV) or None,
        )
    except ConfigurationError as exc:
        raise Failure(f"web: {exc} ({csrf.ENV} or {csrf.SETTING})", USAGE) from exc
    if not web.state.console.shared_secret:
        print(NO_SHARED_SECRET, file=sys.stderr, flush=True)
    print(f"serving the console on http://{host}:{port}{root_path}/", file=sys.stderr, flush=True)
    uvicorn.run(web, host=host, port=port, root_path=root_path, log_level="warning")
    return 0


#: the commands this module adds to ``conventions``
COMMANDS = (web_command,)

"""What every ``conventions`` command shares: the app, the exit codes, one-line errors.

A command is a click command whose callback takes the app first and returns its exit
code; :func:`command` turns it into one that finds the app (``-A`` of ``conventions``, or
``celery -A``'s when it runs inside Celery's CLI), bounds its waits (``--timeout``) and
turns the faults an operator can fix into one line on stderr and a documented code:

===  =====================================================================
 0   done
 1   refused, or not found (a replay refused, no such record, an alarm)
 2   a usage error: a bad option, no app, an app that does not import
 3   a backend did not answer: the broker, the store, the result backend or
     the outbox's database (refused, timed out, or answered in another
     protocol than Redis's); nothing was changed by halves
===  =====================================================================
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar, cast

import click

from conventions.app import App
from conventions.cli import backends
from conventions.cli import format as fmt
from conventions.config import apps
from conventions.errors import ConfigurationError, NewerFormat
from conventions.store import outages

#: exit codes (see the module docstring and docs/reference/cli.md)
OK, REFUSED, USAGE, UNREACHABLE = 0, 1, 2, 3
#: the environment variable naming the app when ``-A`` is not given
APP_ENV = "CONVENTIONS_APP"

F = TypeVar("F", bound=Callable[..., Any])


class Failure(click.ClickException):
    """A one-line error with its exit code (``conventions: error: ...``)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code  # type: ignore[misc]  # click's default, per instance

    def show(self, file: Any = None) -> None:
        click.echo(f"conventions: error: {fmt.shown(self.format_message())}", err=True)


def usage_failure(exc: click.UsageError) -> Failure:
    """Click's usage error as one line, pointing at the command's ``--help``."""
    where = exc.ctx.command_path if exc.ctx is not None else "conventions"
    return Failure(f"{exc.format_message()} (see {where} --help)", USAGE)


class OneLineErrors:
    """Mixed into the group and commands: a usage error while parsing is one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return cast(list[str], super().parse_args(ctx, args))  # type: ignore[misc]
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise usage_failure(exc) from None


class Command(OneLineErrors, click.Command):
    pass


class Group(OneLineErrors, click.Group):
    command_class = Command

    def invoke(self, ctx: click.Context) -> Any:
        """A missing or unknown subcommand, a subcommand's bad option: one line too."""
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise usage_failure(exc) from None


Group.group_class = Group


@dataclass
class Options:
    """The group's options, kept in the click context for the commands."""

    #: ``-A`` as given (``MODULE`` or ``MODULE:ATTR``), or None
    app: str | None
    #: where ``app`` came from: the command line or ``$CONVENTIONS_APP``
    explicit: bool
    #: seconds each connection and each reply may take
    timeout: float
    #: the app Celery's CLI loaded (``celery -A ...``), when run as its plugin
    celery_app: Any = None


def load_app(spec: str) -> App:
    """Import ``MODULE`` (attribute ``app``) or ``MODULE:ATTR`` and check it is an App."""
    module_name, attr = apps.split(spec)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like ``celery -A``: the project's own modules
    try:
        app = apps.import_spec(spec)
    except ImportError as exc:
        raise Failure(f"cannot import the app module {module_name!r}: {exc}", USAGE) from exc
    except AttributeError:
        app = None
    if not isinstance(app, App):
        raise Failure(
            f"{module_name}:{attr} is not a conventions.App (got {type(app).__name__}): "
            "pass -A MODULE or -A MODULE:ATTR naming the project's app",
            USAGE,
        )
    return app


def resolve_app(options: Options) -> App:
    """``-A`` given on the command line, else Celery's app, else ``$CONVENTIONS_APP``."""
    if options.app and options.explicit:
        return load_app(options.app)
    if isinstance(options.celery_app, App):
        return options.celery_app
    if options.app:
        return load_app(options.app)
    if options.celery_app is not None:
        raise Failure(
            f"celery's app is not a conventions.App (got {type(options.celery_app).__name__}): "
            "run celery -A MODULE conventions ...",
            USAGE,
        )
    raise Failure(
        f"no app: pass -A MODULE[:ATTR] (e.g. conventions -A myproject.worker dlq list) "
        f"or set ${APP_ENV}",
        USAGE,
    )


def options_of(ctx: click.Context) -> Options:
    found = ctx.meta.get("conventions.options")
    if found is None:  # a command invoked on its own, outside the group
        found = Options(os.environ.get(APP_ENV), False, backends.DEFAULT_TIMEOUT)
    return cast(Options, found)


def command(
    name: str,
    *,
    before: Callable[..., None] | None = None,
    extra_urls: Callable[..., dict[str, str]] | None = None,
    **settings: Any,
) -> Callable[[Callable[..., int]], click.Command]:
    """``fun(app, **params) -> exit code`` as the click command ``name``.

    ``before(**params)`` checks the options before the app is loaded (a usage error needs
    no app); ``extra_urls(app, **params)`` names more backends for the unreachable
    message (the outbox's database). ``settings`` go to ``click.command``."""

    def decorate(fun: Callable[..., int]) -> click.Command:
        @functools.wraps(fun)
        def callback(**params: Any) -> int:
            ctx = click.get_current_context()
            if before is not None:
                before(**params)
            options = options_of(ctx)
            app = resolve_app(options)
            code = run(app, options.timeout, fun, params, extra_urls)
            if code:
                ctx.exit(code)
            return code

        return click.command(name, cls=Command, **settings)(callback)

    return decorate


def run(
    app: App,
    timeout: float,
    fun: Callable[..., int],
    params: dict[str, Any],
    extra_urls: Callable[..., dict[str, str]] | None = None,
) -> int:
    """Run ``fun`` with bounded waits; a fault an operator can fix is a :class:`Failure`."""
    try:
        with backends.bounded(app, timeout), fmt.guarded():
            return fun(app, **params)
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except ConfigurationError as exc:
        raise Failure(str(exc), USAGE) from exc
    except NewerFormat as exc:  # a record of a newer release: said, never misread
        raise Failure(str(exc), REFUSED) from exc
    except Exception as exc:
        if outages.unreachable(exc) or backends.not_redis(exc):
            extra = extra_urls(app, **params) if extra_urls else None
            message = backends.describe(exc, app, extra)
            if not backends.not_redis(exc):
                message += f" (timeout {timeout:g}s)"
            raise Failure(message, UNREACHABLE) from exc
        raise


def print_json(data: Any, out: TextIO | None = None) -> None:
    """``data`` as indented JSON on stdout (datetimes and the like as strings)."""
    print(json.dumps(data, indent=2, default=str), file=out or sys.stdout)


class Parsed(click.ParamType):  # type: ignore[type-arg]
    """A click type from a parse function; its ValueError is the one-line message."""

    def __init__(self, parse: Callable[[str], Any], name: str) -> None:
        self.parse = parse
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _number(kind: type[int] | type[float], text: str) -> float:
    """``text`` as a finite number of ``kind`` (``nan`` and ``inf`` are no duration)."""
    value = kind(text)
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}")
    return value


def positive(kind: type[int] | type[float], *, most: float | None = None) -> Parsed:
    """A whole (or real, finite) number above zero, and at most ``most`` when given."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if value <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        if most is not None and value > most:
            raise ValueError(f"must be at most {most:g}, got {text!r}")
        return value

    return Parsed(parse, "N" if kind is int else "SECONDS")


def non_negative(kind: type[int] | type[float]) -> Parsed:
    """A whole (or real, finite) number, zero or above."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        if value < 0:
            raise ValueError(f"must be zero or more, got {text!r}")
        return value

    return Parsed(parse, "N" if kind is int else "SECONDS")


#: a TCP port to listen on (a usage error outside 1-65535, never the server's traceback)
PORT = click.IntRange(1, 65535)


def json_option(fun: F) -> F:
    """``--json``: print JSON instead of text (the parameter is ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, help="print JSON")(fun)


def actor_default() -> str:
    return os.environ.get("USER") or "cli"

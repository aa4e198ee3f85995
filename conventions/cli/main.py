"""The ``conventions`` command: triage and replay dead letters, trace a story, purge.

Two ways to run it, the same commands and options in both::

    celery -A myproject.worker conventions dlq list        # inside Celery's CLI (a plugin)
    conventions -A myproject.worker dlq list               # on its own (or python -m conventions)

Inside Celery's CLI the app is the one ``celery -A`` loaded (with ``--config``,
``--broker`` and the rest applied). On its own, ``-A MODULE[:ATTR]`` or
``$CONVENTIONS_APP`` names it; there is no default app. The commands:

    conventions dlq list|show|replay|purge ...       (conventions.cli.dlq)
    conventions trace CORRELATION_ID | retention      (conventions.cli.dlq)
    conventions metrics serve | queues                (conventions.cli.observe)
    conventions doctor | status TASK_ID               (conventions.cli.lifecycle)
    conventions outbox relay|status|dead|init         (conventions.cli.outbox)
    conventions schedule list|trigger|check           (conventions.cli.schedule)
    conventions keys show|clear                       (conventions.cli.keys)
    conventions runs list|show                        (conventions.cli.runs)
    conventions batches list|show|end                 (conventions.cli.batches)
    conventions web                                   (conventions.cli.web)
    conventions migrate [--apply]                     (conventions.cli.migrate)

Every connection a command opens waits at most ``--timeout`` seconds. Exit status: 0
done, 1 refused or not found, 2 a usage error, 3 a backend did not answer (see
``conventions.cli.base``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import click

from conventions.cli import backends, base
from conventions.cli import batches as cli_batches
from conventions.cli import dlq as cli_dlq
from conventions.cli import keys as cli_keys
from conventions.cli import lifecycle as cli_lifecycle
from conventions.cli import migrate as cli_migrate
from conventions.cli import observe as cli_observe
from conventions.cli import outbox as cli_outbox
from conventions.cli import runs as cli_runs
from conventions.cli import schedule as cli_schedule
from conventions.cli import web as cli_web

#: the distribution whose version ``--version`` prints
DISTRIBUTION = "celery-conventions"


def version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import conventions

        return str(getattr(conventions, "__version__", "unknown"))


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"conventions {version()}")
        ctx.exit()


@click.group(
    "conventions",
    cls=base.Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit status: 0 done, 1 refused or not found, 2 usage error, 3 a backend did "
    "not answer within --timeout. See docs/reference/cli.md.",
)
@click.option(
    "-A",
    "--app",
    envvar=base.APP_ENV,
    metavar="MODULE[:ATTR]",
    help="the app: MODULE (its attribute 'app') or MODULE:ATTR (default: $CONVENTIONS_APP; "
    "inside celery, celery -A's app)",
)
@click.option(
    "--timeout",
    type=base.positive(float),
    default=backends.DEFAULT_TIMEOUT,
    show_default=True,
    envvar="CONVENTIONS_TIMEOUT",
    metavar="SECONDS",
    help="longest wait for each connection and reply (broker, store, result backend, "
    "database); past it the command exits 3",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="print the version and exit",
)
@click.pass_context
def cli(ctx: click.Context, /, app: str | None, timeout: float, **_: Any) -> None:
    """Triage and replay dead letters, trace jobs, check the setup, purge old records."""
    source = ctx.get_parameter_source("app")
    celery = getattr(ctx.obj, "app", None)  # celery's CLIContext, when run as its plugin
    ctx.meta["conventions.options"] = base.Options(
        app=app,
        explicit=source is click.core.ParameterSource.COMMANDLINE,
        timeout=timeout,
        celery_app=celery,
    )


for _command in (
    *cli_dlq.COMMANDS,
    *cli_observe.COMMANDS,
    *cli_lifecycle.COMMANDS,
    *cli_outbox.COMMANDS,
    *cli_schedule.COMMANDS,
    *cli_keys.COMMANDS,
    *cli_runs.COMMANDS,
    *cli_batches.COMMANDS,
    *cli_web.COMMANDS,
    *cli_migrate.COMMANDS,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``conventions`` console script: run ``argv`` (default: ``sys.argv[1:]``) and
    return the exit status instead of exiting (``sys.exit(main())``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args, prog_name="conventions", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("conventions: aborted", err=True)
        return 130
    return result if isinstance(result, int) else 0

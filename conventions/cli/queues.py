"""``conventions queues pause|resume``: stop the fleet taking from a queue, and let it again.

    conventions queues pause NAME --reason TEXT [--actor NAME] [--json]
    conventions queues resume NAME [--actor NAME] [--json]

The console's pause and resume from the command line (``conventions.ops.pauses``): a
pause keeps who, when and why in the store and broadcasts ``cancel_consumer`` (a worker
started meanwhile, or one the broadcast missed, reads the record and does not consume
the queue either); a resume removes the record and tells every worker that holds the
queue paused to consume it again. Both are audited: ``conventions trace queue:NAME``,
also when the broker does not answer the broadcast (the record stands: every worker
follows it). Exit status: 0 done, 1 a queue the app does not declare, 2 a usage error,
3 a store that does not answer.
"""

from __future__ import annotations

import sys

import click

from conventions.app import App
from conventions.cli.base import (
    REFUSED,
    USAGE,
    Failure,
    actor_default,
    command,
    json_option,
    print_json,
)
from conventions.observability import queues
from conventions.ops import pauses
from conventions.worker.queue_pauses import WATCH_EVERY


def _known(app: App, queue: str) -> None:
    names = queues.queue_names(app)
    if queue not in names:
        raise Failure(f"no queue {queue!r} in this app (its queues: {', '.join(names)})", REFUSED)


def check_pause(reason: str, **_: object) -> None:
    if not reason.strip():
        raise Failure("queues pause: --reason must not be empty", USAGE)


@command("pause", before=check_pause)
@click.argument("queue", metavar="NAME")
@click.option("--reason", required=True, help="why (kept in the audit trail)")
@click.option("--actor", default=actor_default, help="who pauses (default: $USER, else 'cli')")
@json_option
def pause_command(app: App, queue: str, reason: str, actor: str, as_json: bool) -> int:
    """Stop every worker taking from the queue (its running jobs finish)."""
    _known(app, queue)
    document = pauses.pause(app, queue, actor=actor, reason=reason)
    if as_json:
        print_json(document)
    else:
        workers = document["workers"]
        print(
            f"{queue} paused by {actor}: {len(workers)} worker(s) stopped taking from it"
            + (f" ({', '.join(workers)})" if workers else "")
        )
        if document.get("broadcast"):
            print(_missed(document["broadcast"]), file=sys.stderr)
    return 0


def _missed(why: str) -> str:
    """What a pause or resume whose broadcast failed still did: the record is kept."""
    return (
        f"the broadcast was {why}: each worker follows the record within "
        f"{WATCH_EVERY:g} s of reading it"
    )


@command("resume")
@click.argument("queue", metavar="NAME")
@click.option("--actor", default=actor_default, help="who resumes (default: $USER, else 'cli')")
@json_option
def resume_command(app: App, queue: str, actor: str, as_json: bool) -> int:
    """Let the workers that were paused take from the queue again."""
    _known(app, queue)
    was = pauses.QUEUES.get(app.store, queue)
    done = pauses.resume(app, queue, actor=actor)
    workers, missed = done.workers, done.missed
    if as_json:
        print_json({"queue": queue, "was_paused": was is not None, "workers": workers})
    elif was is None:
        print(f"{queue} was not paused")
    else:
        print(f"{queue} resumed by {actor}: {len(workers)} worker(s) take from it again")
    if missed and not as_json:
        print(_missed(missed), file=sys.stderr)
    return 0

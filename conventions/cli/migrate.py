"""``conventions migrate``: move the stored data to this release's format versions.

    conventions migrate [--apply] [--actor NAME] [--reason TEXT] [--wait S] [--lock-ttl S] [--json]

Without ``--apply`` (the dry run) it reads each place's stamp (the store, and the
transport's keys on the broker's Redis) and prints the steps from the stamped version to
this release's and what each would change; nothing is written. With ``--apply`` it runs
them (:mod:`conventions.upgrade.runner`): one migrate at a time per place, each step
audited (``conventions trace migrate``), resumable after a crash. Run again, it finds
nothing to do. Exit status: 0 done or nothing to do (the dry run too), 1 refused (a
format newer than this release, a stamp the layer never writes: a version that is not a
whole number, a lock whose expiry is not a time; another migrate's lock held past
``--wait``, the lock lost: with ``--json`` its answer on stdout says why, ``refused``),
2 a bad option (``--wait`` or ``--lock-ttl`` not a finite number in range), 3 a place
did not answer.
"""

from __future__ import annotations

import click

from conventions.app import App
from conventions.cli import format as fmt
from conventions.cli.base import (
    REFUSED,
    Failure,
    actor_default,
    command,
    json_option,
    non_negative,
    positive,
    print_json,
)
from conventions.store.stamps import InvalidStamp, LockLost
from conventions.upgrade import runner, steps
from conventions.upgrade.places import places


@command("migrate")
@click.option("--apply", "apply_", is_flag=True, help="run the steps (default: a dry run)")
@click.option(
    "--actor",
    default=actor_default,
    metavar="NAME",
    help="who migrates (default: $USER, else 'cli')",
)
@click.option("--reason", default=None, metavar="TEXT", help="why (kept in the audit trail)")
@click.option(
    "--wait",
    type=non_negative(float),
    default=runner.WAIT,
    show_default=True,
    metavar="SECONDS",
    help="how long to wait for another migrate's lock before refusing",
)
@click.option(
    "--lock-ttl",
    type=positive(float, most=runner.LOCK_TTL_MAX),
    default=runner.LOCK_TTL,
    show_default=True,
    metavar="SECONDS",
    help="how long the lock outlives a migrate that is killed (renewed while it runs; "
    f"at most {runner.LOCK_TTL_MAX:g})",
)
@json_option
def migrate_command(
    app: App,
    *,
    apply_: bool,
    actor: str,
    reason: str | None,
    wait: float,
    lock_ttl: float,
    as_json: bool,
) -> int:
    """List the steps from the stored format versions to this release's; --apply runs them."""
    registry = steps.load()
    with places(app) as found:
        try:
            plans = [runner.plan_place(place, registry) for place in found]
        except InvalidStamp as exc:
            raise _refusal(str(exc), _answer(apply_, 0, 0, []) if as_json else None) from exc
        newer = [fp for plan in plans for fp in plan.formats if fp.newer]
        if not as_json:
            for plan in plans:
                for line in runner.describe(plan):
                    click.echo(fmt.shown(line))
        total = sum(plan.steps for plan in plans)
        report = [_reported(plan) for plan in plans]
        ran = 0

        def refuse(message: str) -> Failure:
            """The refusal, what ran before it included in --json's answer."""
            return _refusal(message, _answer(apply_, total, ran, report) if as_json else None)

        if newer:
            raise refuse(
                f"{', '.join(f'{fp.format} {fp.at}' for fp in newer)} is newer than this "
                "release: upgrade the layer (a rollback keeps the data: see "
                "docs/howto/migrate.md)"
            )
        if apply_ and total:
            for plan in plans:
                if not plan.steps:
                    continue
                if not as_json:
                    click.echo(f"applying to {plan.place.label}:")
                try:
                    ran += runner.apply_place(
                        app, plan.place, registry, actor=actor, reason=reason, wait=wait,
                        lock_ttl=lock_ttl, echo=(lambda _: None) if as_json else click.echo,
                    )  # fmt: skip
                except (runner.Refused, LockLost, InvalidStamp) as exc:
                    raise refuse(str(exc)) from exc
    if as_json:
        print_json(_answer(apply_, total, ran, report))
    elif not total:
        click.echo("nothing to do: every place is at this release's versions")
    elif apply_:
        click.echo(f"done: {ran} step(s) ran; audit: conventions trace {runner.TRAIL}")
    else:
        click.echo(
            f"{total} step(s) to run: this was a dry run, nothing changed; "
            "run it again with --apply"
        )
    return 0


def _refusal(message: str, answer: dict[str, object] | None) -> Failure:
    """A refusal: its one line on stderr, and under --json (``answer``) the answer on
    stdout saying why (``refused``)."""
    if answer is not None:
        print_json({**answer, "refused": " ".join(message.split())})
    return Failure(f"migrate: {message}", REFUSED)


def _reported(plan: runner.PlacePlan) -> dict[str, object]:
    return {
        "place": plan.place.stamp.where,
        "kind": plan.place.kind,
        "formats": [
            {"format": fp.format, "stamped": fp.stamped, "target": fp.target,
             "steps": [s.name for s in fp.steps], "resumes_from": fp.cursor}
            for fp in plan.formats
        ],
    }  # fmt: skip


def _answer(
    applied: bool, total: int, ran: int, places: list[dict[str, object]], refused: str | None = None
) -> dict[str, object]:
    """``--json``'s answer; ``refused``: why nothing (more) was run (exit status 1)."""
    return {"applied": applied, "steps": total, "ran": ran, "refused": refused, "places": places}


#: the commands this module adds to ``conventions``
COMMANDS = (migrate_command,)

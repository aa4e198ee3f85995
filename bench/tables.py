"""The docs' tables of bench figures, made from the result files (:mod:`bench.results`).

Each function takes a result file's data and gives the lines of one Markdown table, with
a first line that says which run it shows. ``python -m bench.docs`` puts them between the
markers of the docs pages; ``python -m bench.scale`` prints the same tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import keep

Table = Callable[[dict[str, Any]], list[str]]

#: what each ``bench.scale`` variant is, in a table
LABELS = {
    "conv": "`conv`: the layer, reliable profile",
    "raw": "`raw`: raw Celery, same reliable settings",
    "quiet": "`quiet`: the layer, no results, no events, prefetch 4",
    "default": "`default`: raw Celery's defaults",
    "conv_noruns": "`conv_noruns`: `conv` without run history",
}
#: each ratio's goal (issue #32), when it has one
GOALS = {"conv/raw": "<= 1.3"}


def caption(data: dict[str, Any]) -> str:
    """Which run a table shows: command, commit, date, cores, load."""
    load = data["load"]
    noisy = "" if load["quiet"] else ", a shared machine: times and CPU figures are noisy"
    start = " / ".join(f"{x:g}" for x in load["start"])
    end = " / ".join(f"{x:g}" for x in load["end"])
    dirty = " (with uncommitted changes)" if data["commit"].endswith("-dirty") else ""
    steal = load.get("steal")
    stolen = "" if steal is None else f", hypervisor steal {steal:.1%} of the CPU time"
    return (
        f"_`{data['command']}` at commit `{data['commit'][:10]}`{dirty} on {data['date'][:10]}, "
        f"{data['cores']} cores, load average {start} at the start and {end} at the end"
        f"{stolen}{noisy}._"
    )


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def scale_costs(data: dict[str, Any]) -> list[str]:
    """Per job and phase: round trips, commands, Redis CPU (and RabbitMQ's)."""
    amqp = any(p["broker"] == "rabbitmq" for p in data["phases"])
    head = "| variant | phase | Redis round trips | Redis commands | Redis CPU (µs) |"
    rule = "|---|---|---:|---:|---:|"
    if amqp:
        head = head.replace("| variant |", "| broker | variant |") + " RabbitMQ CPU (µs) |"
        rule = "|---" + rule + "---:|"
    lines = [caption(data), "", head, rule]
    for p in data["phases"]:
        cells = [LABELS.get(p["variant"], p["variant"]), p["phase"], _num(p["redis_trips"], 2),
                 _num(p["redis_commands"]), _num(p["redis_cpu_us"], 0)]  # fmt: skip
        if amqp:
            cells = [p["broker"], *cells, _num(p["rabbitmq_cpu_us"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def scale_trips(data: dict[str, Any]) -> list[str]:
    """What the round trips are: the commands clients sent per job (a script, a
    ``MULTI``/``EXEC`` pipeline is one), the most frequent first."""
    lines = [caption(data), "", "| broker | variant | phase | round trips | sent per job |",
             "|---|---|---|---:|---|"]  # fmt: skip
    for p in data["phases"]:
        sent = ", ".join(f"`{k}` {v:g}" for k, v in p["trips"].items() if v >= 0.05)
        lines.append(f"| {p['broker']} | `{p['variant']}` | {p['phase']} "
                     f"| {_num(p['redis_trips'], 2)} | {sent} |")  # fmt: skip
    return lines


#: the share of one core a Redis is planned to (room for bursts and BGSAVE/AOF rewrites)
PLANNED = 0.7


def scale_capacity(data: dict[str, Any]) -> list[str]:
    """Per variant and broker: Redis CPU of a whole job, and the jobs/s of one Redis at
    :data:`PLANNED` of a core (one Redis runs its commands on one core)."""
    lines = [caption(data), "", "| broker | variant | Redis CPU per job (publish + run) "
             f"| jobs/s at {PLANNED:.0%} of a core |", "|---|---|---:|---:|"]  # fmt: skip
    whole: dict[tuple[str, str], float] = {}
    for p in data["phases"]:
        key = (p["broker"], p["variant"])
        whole[key] = whole.get(key, 0.0) + p["redis_cpu_us"]
    for (broker, variant), cpu in whole.items():
        rate = PLANNED * 1e6 / cpu if cpu else float("nan")
        lines.append(f"| {broker} | `{variant}` | {cpu:,.0f} µs | about {rate:,.0f} |")
    return lines


def scale_ratios(data: dict[str, Any]) -> list[str]:
    """The whole job (publish + run) of one variant over another's, on Redis."""
    lines = [
        caption(data), "",
        "| whole job (publish + run) | Redis CPU | per round | Redis commands | round trips "
        "| goal |",
        "|---|---:|---|---:|---:|---|",
    ]  # fmt: skip
    for r in data["ratios"]:
        goal = GOALS.get(r["ratio"], "")
        if goal:
            goal = f"{goal}: {_judged(r['cpu'], r['cpu_rounds'], float(goal.split()[1]))}"
        rounds = ", ".join(f"{x:.2f}" for x in r["cpu_rounds"])
        a, b = r["ratio"].split("/")
        lines.append(f"| `{a}` / `{b}` | {r['cpu']:.2f}x | {rounds} | {r['commands']:.2f}x "
                     f"| {r['trips']:.2f}x | {goal} |")  # fmt: skip
    return lines


def _judged(median: float, rounds: list[float], bound: float) -> str:
    """A ratio against its upper bound: the median, and how many rounds disagree (one
    machine's rounds spread more than a step of the code moves them)."""
    above = sum(1 for x in rounds if x > bound)
    if median <= bound:
        return "met" if not above else f"met by the median, {above} of {len(rounds)} rounds above"
    below = len(rounds) - above
    return "**missed**" + (f", {below} of {len(rounds)} rounds below" if below else "")


def _life(seconds: float | None) -> str:
    if seconds is None:
        return "no expiry"
    if seconds >= keep.DAY * 0.99:
        return f"{seconds / keep.DAY:.3g} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds:.0f} s"


def scale_keep(data: dict[str, Any], variant: str = "conv") -> list[str]:
    """What a finished job of ``variant`` leaves, by kind of key, and how long."""
    summary = data["keep"][variant]
    jobs = data["jobs"] + 1
    lines = [
        caption(data), "",
        f"| {variant}: kind of key | keys per job | bytes per job | encoding | TTL read "
        "| stays | cap (items) |",
        "|---|---:|---:|---|---|---|---:|",
    ]  # fmt: skip
    for k in keep.kinds_of(summary):
        if not k.keys:
            lines.append(f"| {k.kind} | 0 | 0 | | | none left | |")
            continue
        cap = "-" if k.cap is None else f"{k.cap:,}"
        ttl, stays = _life(k.ttl_seconds), _life(k.lifetime_seconds)
        share = f"{k.keys / jobs:.2f}" if k.keys * 100 >= jobs else f"{k.keys} shared"
        lines.append(f"| {k.kind} | {share} | {k.bytes_per_job:,.0f} | {k.encoding} "
                     f"| {ttl} | {stays} | {cap} |")  # fmt: skip
    lines += [
        f"| **in all** | | **{summary['bytes_per_job']:,.0f}** | | | | |",
        f"| still there after a day | | {summary['kept_after_day']:,.0f} | | | | |",
        f"| still there after a week | | {summary['kept_after_week']:,.0f} | | | | |",
    ]
    return lines


def scale_sizing(data: dict[str, Any]) -> list[str]:
    """Per variant: bytes per job, what stays a day and a week, GB held at 100 jobs/s."""
    lines = [
        caption(data), "",
        "| settings | bytes per job | still there after a day | after a week "
        "| GB held at 100 jobs/s after a week (caps applied) | without the caps |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for variant, s in data["keep"].items():
        lines.append(
            f"| {LABELS.get(variant, variant)} | {s['bytes_per_job']:,.0f} "
            f"| {s['kept_after_day']:,.0f} | {s['kept_after_week']:,.0f} "
            f"| {s['gb_per_100_jobs_s_week']:,.1f} | {s['gb_per_100_jobs_s_week_uncapped']:,.1f} |"
        )
    return lines


def bench_rows(data: dict[str, Any]) -> list[str]:
    """The main run's rows (``python -m bench --json``)."""
    from bench.report import Row, table

    fields = {"section", "what", "value", "unit", "target", "note"}
    rows = [Row(**{k: v for k, v in row.items() if k in fields}) for row in data["rows"]]
    return [caption(data), "", *table(rows)]


#: the tables a docs marker may name: ``<!-- bench:NAME file=PATH -->``
TABLES: dict[str, Table] = {
    "scale-costs": scale_costs,
    "scale-ratios": scale_ratios,
    "scale-trips": scale_trips,
    "scale-capacity": scale_capacity,
    "scale-keep": scale_keep,
    "scale-sizing": scale_sizing,
    "bench": bench_rows,
}


def scale_text(data: dict[str, Any]) -> list[str]:
    """What ``python -m bench.scale`` prints: every table of its run, and its notes."""
    out = [*scale_costs(data), "", *scale_ratios(data)[2:], "", *scale_trips(data)[2:]]
    for variant in data["keep"]:
        out += ["", *scale_keep(data, variant)[2:]]
    out += ["", *scale_sizing(data)[2:], "", *scale_capacity(data)[2:], ""]
    return out + [f"- {note}" for note in data.get("notes", [])]

"""The demo's summary, for a person: one line per convention, then one whole story (the
``conventions trace`` tree of one request), then where to look next."""

from __future__ import annotations

from typing import Any

from demo import story

#: what the embedded default (filesystem transport + SQLite) cannot show
EMBEDDED_CANNOT = [
    "queue depth and the oldest waiting job's age (`conventions queues`, the exporter's "
    "queue gauges): they are read from Redis lists",
    "crash-safety: the filesystem transport deletes a message file when a worker reads it, "
    "so a kill -9 of a whole worker loses the jobs it had prefetched",
    "the Prometheus exporter (`conventions metrics serve`): it reads the queues from Redis",
    "several machines: the broker is a folder of this one",
]

#: what RabbitMQ cannot tell the queues view and the exporter
AMQP_CANNOT = [
    "the oldest waiting job's age: a passive queue.declare gives depth and consumers only "
    "(`conventions queues` shows ?, the exporter leaves that gauge out)",
    "the transport's own figures (delayed, in flight, in inboxes, consumers alive): they are "
    "kept by the layer's Redis transport",
]


#: the exporter's series the summary shows (summed over their labels)
METRICS = (
    "jobs_published_total",
    "jobs_succeeded_total",
    "jobs_retried_total",
    "jobs_deduplicated_total",
    "jobs_dead_lettered_total",
    "dead_letters",
    "outbox_lag_seconds",
)


def _refused(s: dict[str, Any]) -> str:
    errors = s["webhooks"]["refused"]
    shown = [e.split("event_id: ", 1)[-1].split(" [", 1)[0][:60] for e in errors]
    return f"{len(errors)} webhook (400, nothing enqueued): " + "; ".join(shown)


def _jobs(s: dict[str, Any]) -> str:
    jobs = s["jobs"]
    names = (
        "published",
        "started",
        "succeeded",
        "retried",
        "deferred",
        "skipped_duplicate",
        "deduplicated",
        "replayed",
    )
    return " · ".join(f"{name.replace('_', ' ')} {jobs[name]}" for name in names if jobs.get(name))


def _dead(s: dict[str, Any]) -> list[str]:
    dead = s["dead_letters"]
    lines = [", ".join(f"{k} {v}" for k, v in sorted(dead["by_category"].items()))]
    for record in dead["records"]:
        after = "  -> replayed" if record["replayed"] else ""
        if record["id"] == s["replay"]["refused"]["dead_letter_id"]:
            after = "  -> replay refused (replayable=False: it moves money)"
        message = record["message"]
        if record["category"] == "unparseable":  # the decoder's own words add nothing here
            message = message.split(": ", 1)[0]
        lines.append(f"  {record['category']:<11} {record['task']:<24} {message[:56]}{after}")
    return lines


def _report(s: dict[str, Any]) -> str:
    report, row = s["report"], s["shop"]["report"] or {}
    seen = report["progress"]
    steps = f"{seen[0]['done']} of {seen[0]['total']} ... {seen[-1]['done']}" if seen else "none"
    revenue = row.get("revenue_minor", 0) / 100
    return (
        f"{report['occurrence']}: {report['state']}, {row.get('orders')} orders "
        f"(the shop has {s['shop']['orders_today']} today), {revenue:,.2f} EUR; "
        f"progress seen {len(seen)} times ({steps})"
    )


def _queues(s: dict[str, Any]) -> str:
    if "queues" not in s:
        return "needs Redis or RabbitMQ (see below)"
    peaks, aged = s["queues"]["peaks"], s.get("broker") != "amqp"
    return (
        " · ".join(
            f"{name}: peak {int(p['depth'])} waiting"
            + (f", oldest waited {p['oldest_age']:.2f}s" if aged else "")
            for name, p in sorted(peaks.items())
        )
        + f"  ({s['queues']['samples']} samples)"
    )


def lines(s: dict[str, Any]) -> list[str]:
    d, shop, smtp = s["duplicates"], s["shop"], s["smtp"]
    replies = smtp["replies"]
    out = [
        f"== celery-conventions demo: ran on {s['where']} in {s['wall_seconds']}s",
        f"  jobs            {_jobs(s)}",
        f"  duplicates      {d['absorbed']} of {d['sent']} webhook re-deliveries absorbed "
        f"({d['absorbed_at_publish']} at .delay(), {d['absorbed_by_ledger']} by the ledger); "
        f"payments applied twice: {shop['paid_twice']}",
        f"  receipts        {shop['receipts']} sent for {shop['paid']} paid orders "
        f"({len(story.WEB_ORDERS)} via the outbox); the SMTP sink accepted {smtp['accepted']}, "
        f"answered 451 x{replies.get('451', 0)} and 550 x{replies.get('550', 0)}",
        f"  outbox          {s['outbox']['published']} rows committed with their orders and "
        f"published by the relay; {s['outbox']['pending']} pending "
        f"(lag {s['outbox']['lag_seconds']:.1f}s)",
        f"  retries         {len(s['retries'])}, each after its own jittered backoff:",
    ]
    for r in s["retries"]:
        out.append(
            f"    {r['key']:<24} attempt {r['attempt']} -> again in {r['delay']:.2f}s"
            f"  ({r['reason']})"
        )
    dead = _dead(s)
    out.append(f"  dead letters    {dead[0]}")
    out += [f"  {line}" for line in dead[1:]]
    replay = s["replay"]
    out += [
        f'  replay          {replay["cli"]} by {replay["actor"]}: "{replay["reason"]}"',
        f"  daily report    {_report(s)}",
        f"  beat            sent today's occurrence once; a second send: "
        f"{s['report']['second_send'][:70]}",
        f"  refused         {_refused(s)}",
        f"  queues          {_queues(s)}",
        "  logs            JSON lines; the traced request's id is in "
        + ", ".join(f"{n} ({c})" for n, c in s["log_lines"].items())
        + " of .demo/logs/",
    ]
    if "metrics" in s:
        totals = s["metrics"]["totals"]
        shown = [n for n in METRICS if n in totals]
        out.append(
            f"  metrics         {s['metrics']['url']} (scraped at the end): "
            + ", ".join(f"{n} {totals[n]:g}" for n in shown)
        )
    out += ["", f"  one request, start to end: conventions trace {s['trace']['correlation_id']}"]
    out += [f"    {line}" for line in s["trace"]["text"].splitlines()]
    failed = [name for name, ok in s["checks"].items() if not ok]
    out += [
        "",
        f"  checks          {len(s['checks']) - len(failed)} of {len(s['checks'])} hold"
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
    ]
    return out


def next_steps(s: dict[str, Any], env: dict[str, str]) -> list[str]:
    if s["redis"]:
        prefix = (
            f"REDIS_URL={env['REDIS_URL']} CONVENTIONS_STORE_URL={env['CONVENTIONS_STORE_URL']}"
        )
        out = [
            "look next (the demo's data stays until the next run):",
            f"  {prefix} \\",
            "    .venv/bin/celery -A tasks flower           # then http://localhost:5555",
            f"  {prefix} \\",
            "    .venv/bin/conventions -A tasks metrics serve   # http://localhost:9808/metrics",
        ]
    elif s.get("broker") == "amqp":
        prefix = (
            f"CELERY_BROKER_URL={env['CELERY_BROKER_URL']} "
            f"CONVENTIONS_STORE_URL={env['CONVENTIONS_STORE_URL']}"
        )
        out = ["RabbitMQ cannot show:"]
        out += [f"  - {item}" for item in AMQP_CANNOT]
        out += [
            "look next (the demo's data stays until the next run):",
            f"  {prefix} \\",
            "    .venv/bin/conventions -A tasks metrics serve   # http://localhost:9808/metrics",
        ]
    else:
        prefix = "CELERY_BROKER_URL=filesystem://"
        out = ["the embedded default cannot show:"]
        out += [f"  - {item}" for item in EMBEDDED_CANNOT]
        out += [
            "  run it with a Redis on localhost:6379 (or REDIS_URL) to see them",
            "look next (the demo's data stays until the next run):",
        ]
    cli = f"  {prefix} .venv/bin/conventions -A tasks"
    out += [
        f"{cli} dlq list",
        f"{cli} trace {s['trace']['correlation_id']}",
        f"{cli} status {s['report']['task_id']}",
    ]
    if s["redis"] or s.get("broker") == "amqp":
        out.append(f"{cli} queues --watch")
    out.append("  .demo/summary.json has every number above; .demo/logs/ each process's log")
    return out


def show(s: dict[str, Any], env: dict[str, str]) -> None:
    print()
    print("\n".join(lines(s)))
    print()
    print("\n".join(next_steps(s, env)))
    verdict = "every check holds" if s["ok"] else "some checks failed (see .demo/logs/)"
    print(f"demo: {verdict}")

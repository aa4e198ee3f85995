"""The demo's main: choose where to run, start the processes, play the story, summarise,
and stop every process it started (in a ``finally``: an error or a Ctrl-C too)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.request
from typing import Any

from demo import render, story, where
from demo.procs import Fleet

#: lane presets of docs/howto/worker-lifecycle.md (gossip and mingle off: a faster start)
WORKER = [
    "-m",
    "celery",
    "-A",
    "tasks",
    "worker",
    "--without-gossip",
    "--without-mingle",
    "--loglevel=INFO",
]
EMAIL = [*WORKER, "-Q", "email", "-c", "4", "--prefetch-multiplier", "4", "-n", "email@%h"]
HEAVY = [
    *WORKER,
    "-Q",
    "heavy",
    "-c",
    "1",
    "--prefetch-multiplier",
    "1",
    "-O",
    "fair",
    "--max-tasks-per-child",
    "20",
    "-n",
    "heavy@%h",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(place: where.Place) -> dict[str, str]:
    """What every process of the demo gets, on top of the broker and store."""
    path = os.environ.get("PYTHONPATH")
    return {
        **place.env,
        "CONVENTIONS_SCHEDULE": "demo.schedule:ENTRIES",  # beat: today's report, now
        "CONVENTIONS_LOG_FORMAT": "json",  # one JSON object per log line, ids included
        "REPORTS_CHUNK_ROWS": "20",  # the report works in chunks of 20 orders...
        "REPORTS_CHUNK_PAUSE": "0.3",  # ...and pauses between them: progress to watch
        "DEMO_RUN_ID": place.run_id,  # marks the demo's processes (the test looks for it)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(where.ROOT), path])),
    }


def start(fleet: Fleet, observable: bool) -> dict[str, Any]:
    """The SMTP sink and the web app first (their ports are free ones they picked), then
    the relay, the two lanes' workers and, on Redis or RabbitMQ, the metrics exporter."""
    mail, data = fleet.data / "mail", fleet.data
    sink = ["-m", "demo.smtp_sink", "--dir", str(mail), "--flaky", str(story.FLAKY),
            "--reject-domain", story.BAD_DOMAIN]  # fmt: skip
    fleet.start("smtp", sink)
    fleet.start("web", ["-m", "demo.webapp", "--port-file", str(data / "web.port"),
                        "--log-format", "json"])  # fmt: skip
    fleet.wait_for("smtp", (mail / "port").exists)
    smtp = int((mail / "port").read_text())
    fleet.env["SMTP_URL"] = f"smtp://127.0.0.1:{smtp}"
    fleet.start("relay", ["-m", "conventions", "-A", "tasks", "outbox", "relay", "--poll", "0.2"])
    fleet.start("email", EMAIL, {"CONVENTIONS_SHUTDOWN_GRACE": "60"})
    fleet.start("heavy", HEAVY, {"CONVENTIONS_SHUTDOWN_GRACE": "300"})
    ports: dict[str, Any] = {"smtp": smtp}
    if observable:
        ports["metrics"] = free_port()
        exporter = ["-m", "conventions", "-A", "tasks", "metrics", "serve",
                    "--addr", "127.0.0.1", "--port", str(ports["metrics"])]  # fmt: skip
        fleet.start("metrics", exporter)
    fleet.wait_for("web", (data / "web.port").exists)
    ports["web"] = int((data / "web.port").read_text())
    fleet.wait_for_line("relay", b"publishing from")
    for name in ("email", "heavy"):
        fleet.wait_for_line(name, b" ready.")
    return ports


def scrape(port: int) -> dict[str, Any]:
    """The exporter's page as Prometheus reads it: each series summed over its labels."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("celery_conventions_") and "_bucket" not in line:
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0].removeprefix("celery_conventions_")
            totals[name] = totals.get(name, 0.0) + float(value)
    return {"url": url, "totals": totals}


def busy_day(fleet: Fleet, observer: Any, base: str, facts: dict[str, Any]) -> None:
    """Orders, the webhook burst, the poison message, the failures and the replay."""
    from demo.summary import EXPECTED_DEAD

    story.place_orders(base, facts)
    observer.say(f"{len(story.WEB_ORDERS)} orders placed via POST /orders: order and "
                 "receipt job in one transaction (outbox), the relay publishes")  # fmt: skip
    story.webhook_burst(base, facts)
    hooks = facts["webhooks"]
    observer.say(f"{hooks['posted']} payment webhooks posted at once: {hooks['events']} "
                 f"events, {hooks['duplicates_sent']} re-deliveries, 1 unknown event, "
                 f"{len(hooks['refused'])} refused (400)")  # fmt: skip
    story.push_poison(facts)
    observer.say("a poison message (JSON cut short) pushed straight into the email queue")
    good, dead = len(story.WEB_ORDERS) - 1 + story.WEBHOOK_EVENTS, sum(EXPECTED_DEAD.values())
    story.settle(observer, receipts=good, dead=dead)
    observer.say(f"settled: {good} receipts sent, dead letters kept" + observer.queue_line())
    story.late_redelivery(base, facts)
    observer.say("evt_0001's webhook arrives once more, long after it was applied")
    story.replay_the_receipt(fleet, observer, facts)
    story.settle(observer, receipts=good + 1, dead=dead, skipped=1)


def play(fleet: Fleet, place: where.Place, started: float) -> dict[str, Any]:
    """The scenario, then the summary's numbers (read before the processes stop)."""
    from demo import summary
    from demo.observe import Observer

    story.seed_shop()
    ports = start(fleet, place.observable)
    observer = Observer(place.observable, started)
    facts: dict[str, Any] = {"where": place.where, "redis": place.redis, "ports": ports,
                             "broker": place.broker}  # fmt: skip
    try:
        exporter = ", metrics exporter" if place.observable else ""
        observer.say(f"started: smtp sink :{ports['smtp']} (451 to its first {story.FLAKY} "
                     f"mails), web app :{ports['web']}, outbox relay, email worker (-c 4), "
                     f"heavy worker (-c 1){exporter}")  # fmt: skip
        busy_day(fleet, observer, f"http://127.0.0.1:{ports['web']}", facts)
        beat = ["-m", "celery", "-A", "tasks", "beat", "--loglevel=INFO",
                "-s", str(fleet.data / "celerybeat-schedule")]  # fmt: skip
        fleet.start("beat", beat)
        story.follow_report(fleet, observer, facts)
        if place.observable:
            facts["metrics"] = scrape(ports["metrics"])
        return summary.collect(fleet, observer, facts, place.observable)
    finally:
        observer.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    shutil.rmtree(where.DATA, ignore_errors=True)
    where.DATA.mkdir(parents=True)
    place = where.choose(embedded="--embedded" in args)
    print(f"demo: running on {place.where}", flush=True)
    if place.lowered:
        print(f"demo: {place.lowered}", flush=True)
    run = {"run_id": place.run_id, "where": place.where, "pid": os.getpid()}
    (where.DATA / "run.json").write_text(json.dumps(run))  # the test finds the processes
    env = environment(place)
    os.environ.update(env)  # this process imports tasks with the same settings
    sys.path.insert(0, str(where.ROOT))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below
    # Ctrl-C stops the demo even when it was started with SIGINT ignored (a background
    # job of a non-interactive shell, `nohup`): Python keeps an inherited SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    fleet = Fleet(where.DATA, env, where.ROOT)
    try:
        result = play(fleet, place, started)
    except KeyboardInterrupt:
        print("demo: interrupted; stopping every process it started", flush=True)
        return 130
    except RuntimeError as exc:  # a step did not happen in time: say which, and where to look
        print(f"demo: {exc}\ndemo: every process's log is in .demo/logs/", flush=True)
        return 1
    finally:
        stopped = fleet.stop_all()
    result["stopped_in"] = stopped
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["run_id"] = place.run_id
    result["store_url"] = env["CONVENTIONS_STORE_URL"]
    result["database_url"] = env["DATABASE_URL"]
    result["ok"] = all(result["checks"].values())
    (where.DATA / "summary.json").write_text(json.dumps(result, indent=2, default=str))
    render.show(result, env)
    return 0 if result["ok"] else 1

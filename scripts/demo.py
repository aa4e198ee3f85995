"""``make demo``: the main job, through real worker processes.

Picks a broker and says which: ``REDIS_URL``/``CELERY_BROKER_URL`` when set, else a Redis
on localhost:6379 when one answers (databases 3 and 4, emptied first), else the embedded
default (Celery's filesystem transport and SQLite under ``.demo/``). Starts a worker for
the ``email`` lane and one for the ``heavy`` lane, plays a small shop scenario, prints a
summary, and stops everything it started.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `tasks` is imported only after the choice
DATA = ROOT / ".demo"
ORDERS = 8


def choose_broker(embedded: bool = False) -> tuple[str, dict[str, str]]:
    """Which broker and store the demo runs on, as environment for every process."""
    env: dict[str, str] = {"CONVENTIONS_DATA_DIR": str(DATA)}
    env["DATABASE_URL"] = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA / 'shop.sqlite3'}"
    given = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL")
    if embedded:
        given = None
    if given:
        env["CONVENTIONS_STORE_URL"] = os.environ.get(
            "CONVENTIONS_STORE_URL", f"sqlite:///{DATA / 'store.sqlite3'}"
        )
        return f"the broker you configured ({given.split('@')[-1]})", env
    try:
        if embedded:
            raise ConnectionError("--embedded asked for the embedded default")
        import redis

        client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=0.5)
        client.ping()
        for db in (3, 4):
            redis.Redis(host="127.0.0.1", port=6379, db=db).flushdb()
        client.close()
        env["REDIS_URL"] = "redis://127.0.0.1:6379/3"
        env["CONVENTIONS_STORE_URL"] = "redis://127.0.0.1:6379/4"
        return "Redis on localhost:6379 (databases 3 and 4)", env
    except Exception:
        env["CELERY_BROKER_URL"] = "filesystem://"
        env["CONVENTIONS_STORE_URL"] = f"sqlite:///{DATA / 'store.sqlite3'}"
        return "the embedded default: Celery's filesystem transport + SQLite in .demo/", env


def start_worker(name: str, queues: str, concurrency: int, env: dict[str, str]) -> Any:
    log = (DATA / "logs" / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queues,
         "-c", str(concurrency), "-n", f"{name}@%h", "--without-gossip",
         "--without-mingle", "--loglevel=INFO"],
        cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def wait_ready(names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            if b" ready." in (DATA / "logs" / f"{name}.log").read_bytes():
                pending.discard(name)
        time.sleep(0.2)
    if pending:
        raise SystemExit(f"workers not ready: {sorted(pending)} (see .demo/logs/)")


def scenario() -> dict[str, Any]:
    """Publish the shop's jobs and wait for every one; return what happened."""
    from conventions import PayloadError, bind
    from tasks import app, db, shop
    from tasks.payments import apply_event
    from tasks.reports import daily_sales

    with db.transaction() as session:
        shop.seed(session, customers=3, orders=ORDERS)
    out: dict[str, Any] = {"refused": [], "duplicates": 0}
    results = []
    with bind(actor_id="demo") as trace:
        out["correlation_id"] = trace.correlation_id
        for n in range(1, ORDERS + 1):
            for _ in range(2):  # every webhook arrives twice
                result = apply_event.delay(event_id=f"evt_{n:04d}")
                if result.deduplicated:
                    out["duplicates"] += 1
                else:
                    results.append(result)
        results.append(apply_event.delay(event_id="evt_9999"))  # unknown: permanent
        results.append(daily_sales.delay(business_date=dt.datetime.now(dt.UTC).date()))
        for bad in ({"event_id": "evt 1; drop table"}, {"event_id": "evt_1", "email": "a@b.c"}):
            try:
                apply_event.delay(**bad)
            except PayloadError as exc:
                out["refused"].append(str(exc).split(": ", 1)[-1][:90])
    started = time.monotonic()
    states: Counter[str] = Counter()
    for result in results:
        try:
            result.get(timeout=60, propagate=False)
        finally:
            states[result.state] += 1
    out["wall"] = time.monotonic() - started
    out["states"] = dict(states)
    out["report"] = results[-1].result
    with db.transaction() as session:
        out["receipts"] = shop.count_rows(session, shop.SentEmail)
        out["paid"] = session.query(shop.Order).filter(shop.Order.status == shop.PAID).count()
    deadline = time.monotonic() + 30  # receipts are child jobs: let the last ones land
    while out["receipts"] < out["paid"] and time.monotonic() < deadline:
        time.sleep(0.2)
        with db.transaction() as session:
            out["receipts"] = shop.count_rows(session, shop.SentEmail)
    out["dead"] = Counter(str(r.category) for r in app.store.list_dead_letters(limit=1000))
    out["trace"] = app.store.audit_for(out["correlation_id"])
    return out


def summary(where: str, out: dict[str, Any]) -> None:
    events = Counter(e.event for e in out["trace"])
    print(f"\n== celery-conventions demo: ran on {where}")
    print(f"  jobs finished        {sum(out['states'].values())}  {out['states']}")
    print(f"  duplicates absorbed  {out['duplicates']} webhook re-deliveries published nothing")
    print(f"  orders paid          {out['paid']} of {ORDERS}; receipts sent {out['receipts']}")
    print(f"  daily report         {out['report']}")
    print(f"  dead letters         {dict(out['dead']) or 'none'}")
    for reason in out["refused"]:
        print(f"  refused at .delay()  {reason}")
    print(f"  audit trail          {dict(events)} under correlation {out['correlation_id']}")
    print(f"  wall time            {out['wall']:.1f}s")
    if "Redis" in where:
        print("  look next: `celery -A tasks flower` (http://localhost:5555), with the env above")
    else:
        print("  the embedded default cannot show: Flower, queue ages, crash redelivery")
        print("  (a kill -9 of a whole worker loses its prefetched message on this transport)")
    print("  next: `conventions dlq list` and `conventions trace <correlation id>`")


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    (DATA / "logs").mkdir(parents=True)
    where, env = choose_broker(embedded="--embedded" in sys.argv)
    print(f"demo: running on {where}")
    os.environ.update(env)
    workers = {
        "email": start_worker("email", "email", 2, env),
        "heavy": start_worker("heavy", "heavy", 1, env),
    }
    try:
        wait_ready(list(workers))
        print("demo: workers ready: email (2 processes), heavy (1 process)")
        out = scenario()
    finally:
        for proc in workers.values():
            proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    summary(where, out)
    ok = out["states"].get("SUCCESS", 0) == ORDERS + 1 and out["paid"] == ORDERS
    print("demo: every job done" if ok else "demo: some jobs did not finish (see .demo/logs/)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

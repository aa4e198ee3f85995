"""The scenario: one day of the shop, played against the running processes.

1. orders through the web app: order and receipt job in one transaction (the outbox);
2. a burst of payment webhooks, many delivered twice or three times, one for an event
   nobody knows, one malformed; a poison message pushed straight into the queue;
3. the mail provider is flaky at first (451: retried with backoff) and one customer's
   mailbox does not exist (550: dead-lettered as permanent);
4. support fixes that customer's address and replays the dead letter (actor, reason);
5. beat sends the daily report, which reports its progress chunk by chunk, while a
   re-run of yesterday's waits behind it in the heavy lane.

Every step writes what it did into ``facts`` (the summary checks it against the shop
database, the store and the SMTP sink's log).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from demo.observe import Observer
from demo.procs import Fleet

SEEDED_ORDERS = 240  #: today's orders already in the shop (the report counts them all)
WEBHOOK_EVENTS = 12  #: payment events whose webhooks arrive (evt_0001..)
TRIPLE = 4  #: the first events' webhooks arrive three times, the others twice
FLAKY = 4  #: the SMTP sink answers 451 to its first mails
BAD_DOMAIN = "mailbox-gone.invalid"  #: the sink answers 550 to this domain
MOVED = "cus_0009"  #: the customer whose address is wrong until support fixes it
WEB_ORDERS = [
    ("ord_web_01", "cus_0001", 1250),
    ("ord_web_02", "cus_0002", 4990),
    ("ord_web_03", MOVED, 2500),
    ("ord_web_04", "cus_0003", 899),
    ("ord_web_05", "cus_0001", 15000),
    ("ord_web_06", "cus_0002", 3200),
]
REPLAY_ACTOR = "support:ana"
REPLAY_REASON = f"{MOVED} corrected the e-mail address (ticket 4711)"
POISON = b'{"event_id": evt_0042'  #: JSON cut short: no worker can read it


def seed_shop() -> None:
    """Today's orders and their payment events, and a customer with a dead address."""
    from conventions.transactional import outbox
    from tasks import db, shop

    with db.transaction() as session:
        shop.seed(session, customers=3, orders=SEEDED_ORDERS)
        if session.get(shop.Customer, MOVED) is None:
            session.add(shop.Customer(id=MOVED, name="Moved Away", email=f"old@{BAD_DOMAIN}"))
    outbox.create_table(db.engine())


def http(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
    """One request to the web app: (status, JSON body, the X-Correlation-ID header)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    request.add_header("X-User-ID", "demo")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                response.status,
                json.loads(response.read()),
                response.headers["X-Correlation-ID"],
            )
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers["X-Correlation-ID"]


def place_orders(base: str, facts: dict[str, Any]) -> None:
    """The checkout: POST /orders, one request each."""
    facts["web_orders"] = {}
    for order_id, customer, amount in WEB_ORDERS:
        status, data, correlation = http(
            base,
            "POST",
            "/orders",
            {"order_id": order_id, "customer_id": customer, "amount_minor": amount},
        )
        if status != 201:
            raise RuntimeError(f"POST /orders {order_id}: {status} {data}")
        facts["web_orders"][order_id] = {"correlation_id": correlation, "job": data["receipt_job"]}


def webhook_burst(base: str, facts: dict[str, Any]) -> None:
    """Every payment webhook arrives at least twice, all at once, in a shuffled order."""
    deliveries = []
    for n in range(1, WEBHOOK_EVENTS + 1):
        deliveries += [f"evt_{n:04d}"] * (3 if n <= TRIPLE else 2)
    random.Random(7).shuffle(deliveries)
    deliveries.append("evt_9999")  # an event the shop never saw: a permanent failure
    deliveries.append("evt 1; drop table")  # refused at .delay(): 400, nothing enqueued
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda e: http(base, "POST", "/webhooks/payments", {"event_id": e}), deliveries
            )
        )
    facts["webhooks"] = {
        "posted": len(deliveries),
        "events": WEBHOOK_EVENTS,
        "duplicates_sent": len(deliveries) - 2 - WEBHOOK_EVENTS,
        "deduplicated_answers": sum(1 for s, d, _ in answers if s == 202 and d["deduplicated"]),
        "refused": [d.get("error", "")[:300] for s, d, _ in answers if s == 400],
        "correlation_ids": sorted({c for _, _, c in answers if c}),
    }
    facts["unknown_event_correlation"] = answers[-2][2]


def late_redelivery(base: str, facts: dict[str, Any]) -> None:
    """The provider sends ``evt_0001`` once more, long after it was applied: the enqueue
    reservation is gone (``until_done``), so the job is published, and the execution
    ledger skips its body (``skipped_duplicate``)."""
    status, data, correlation = http(base, "POST", "/webhooks/payments", {"event_id": "evt_0001"})
    if status != 202:
        raise RuntimeError(f"the late webhook was refused: {status} {data}")
    facts["webhooks"]["duplicates_sent"] += 1
    facts["webhooks"]["posted"] += 1
    facts["webhooks"]["correlation_ids"].append(correlation)
    facts["webhooks"]["late"] = {"job": data["job"], "published": not data["deduplicated"]}


def push_poison(facts: dict[str, Any]) -> None:
    """A message no worker can read, straight into the ``email`` queue (a broken
    producer): the consumer keeps it as an ``unparseable`` dead letter."""
    from kombu import Producer

    from tasks import app

    queue = app.amqp.queues["email"]
    with app.connection_for_write() as connection:
        Producer(connection).publish(
            POISON,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            content_type="application/json",
            content_encoding="utf-8",
            headers={"task": "payments.apply_event.v1", "id": "poison-0001", "lang": "py"},
        )
    facts["poison"] = POISON.decode()


def settle(
    observer: Observer, receipts: int, dead: int, skipped: int = 0, timeout: float = 120
) -> None:
    """Wait until ``receipts`` receipts were sent, ``dead`` dead letters are kept and the
    ledger skipped ``skipped`` duplicates, saying how it goes every few seconds."""
    deadline, last = time.monotonic() + timeout, 0.0
    while True:
        now = observer.snapshot()
        if (
            now["receipts"] >= receipts
            and now["dead_letters"] >= dead
            and now["skipped"] >= skipped
            and not now["outbox"]
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shop did not settle: {now}")
        if time.monotonic() - last > 2.5:
            last = time.monotonic()
            observer.say(
                f"receipts {now['receipts']}/{receipts}, dead letters {now['dead_letters']}/"
                f"{dead}, retries {now['retried']}, outbox waiting {now['outbox']}"
                + observer.queue_line()
            )
        time.sleep(0.3)


def fix_address() -> None:
    """Support corrects the customer's e-mail address in the shop database."""
    from tasks import db, shop

    with db.transaction() as session:
        customer = session.get(shop.Customer, MOVED)
        assert customer is not None
        customer.email = "moved@example.com"


def replay_the_receipt(fleet: Fleet, observer: Observer, facts: dict[str, Any]) -> None:
    """Support fixes the address, then replays the receipt's dead letter with the CLI
    (who and why go into the audit trail); the unknown payment's dead letter is refused
    without ``--force`` (``payments.apply_event.v1`` moves money)."""
    from tasks import app

    records = app.store.list_dead_letters(limit=100)
    receipt = next(r for r in records if r.task == "email.send_receipt.v2")
    payment = next(
        r for r in records if r.task == "payments.apply_event.v1" and r.category == "permanent"
    )
    fix_address()
    argv = ["dlq", "replay", receipt.id, "--reason", REPLAY_REASON, "--actor", REPLAY_ACTOR]
    observer.say(
        f"support fixed {MOVED}'s address and replays: conventions {' '.join(argv[:3])} "
        f"--reason '{REPLAY_REASON}' --actor {REPLAY_ACTOR}"
    )
    code, out, err = fleet.cli(argv)
    if code != 0:
        raise RuntimeError(f"the replay failed: {out}{err}")
    refused_code, _, refused = fleet.cli(["dlq", "replay", payment.id, "--reason", "try again"])
    facts["replay"] = {
        "dead_letter_id": receipt.id,
        "order_id": receipt.payload.get("order_id"),
        "actor": REPLAY_ACTOR,
        "reason": REPLAY_REASON,
        "cli": out.strip(),
        "refused": {"dead_letter_id": payment.id, "exit": refused_code, "why": refused.strip()},
    }
    observer.say(out.strip())
    why = next((p for p in refused.split(": ") if "replayable" in p), refused).split(" (")[0]
    observer.say(f"a replay of the unknown payment is refused (exit {refused_code}): {why}")


def follow_report(fleet: Fleet, observer: Observer, facts: dict[str, Any]) -> None:
    """Beat sends today's report occurrence; the heavy worker runs it chunk by chunk and
    its progress (``ctx.progress``) shows as it goes."""
    from conventions.cli.lifecycle import job_status
    from conventions.schedules import entries as schedules
    from demo.schedule import ENTRIES
    from tasks import app

    entry = ENTRIES[0]
    moment = entry.schedule.latest(schedules.now())
    assert moment is not None
    occurrence = entry.occurrence(moment)
    task_id = _wait_published(app, occurrence.correlation_id)
    observer.say(f"beat sent {entry.name} {occurrence.label} as job {task_id} (heavy lane)")
    progress: list[dict[str, Any]] = []
    rerun = None
    deadline = time.monotonic() + 120
    while True:
        status = job_status(app, task_id)
        latest = status["progress"]
        if latest and (not progress or latest.get("done") != progress[-1].get("done")):
            progress.append(latest)
            observer.say(
                f"daily report: {latest.get('done')} of {latest.get('total')} orders "
                f"({latest.get('percent')}%)" + observer.queue_line()
            )
        if latest and rerun is None:
            rerun = rerun_yesterday(observer, occurrence.date)
        if status["state"] in ("SUCCESS", "FAILURE") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if rerun is not None:
        rerun.get(timeout=60, propagate=False)
    code, again, again_err = fleet.cli(["schedule", "trigger", entry.name])
    facts["report"] = {
        "task_id": task_id,
        "occurrence": occurrence.label,
        "state": status["state"],
        "result": app.AsyncResult(task_id).result if status["state"] == "SUCCESS" else None,
        "progress": progress,
        "correlation_id": occurrence.correlation_id,
        "second_send": (again + again_err).strip(),
        "second_send_exit": code,
        "rerun": None if rerun is None else {"task_id": rerun.id, "state": rerun.state},
    }
    observer.say(f"a second send of that occurrence is absorbed: {(again + again_err).strip()}")


def rerun_yesterday(observer: Observer, today: dt.date) -> Any:
    """Finance asks for yesterday's report again while today's runs: one process, one
    message at a time on the heavy lane, so it waits in the queue (its age shows)."""
    from conventions import bind
    from tasks.reports import daily_sales

    with bind(actor_id="finance"):
        result = daily_sales.delay(business_date=today - dt.timedelta(days=1))
    observer.say(
        "finance asks for yesterday's report again: it waits behind today's "
        "(heavy lane: one process, prefetch 1)"
    )
    return result


def _wait_published(app: Any, correlation_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in app.store.audit_for(correlation_id):
            if event.event == "published":
                return str(event.task_id)
        time.sleep(0.2)
    raise RuntimeError("beat did not send the daily report (see .demo/logs/beat.log)")

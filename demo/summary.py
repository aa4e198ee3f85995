"""The demo's numbers, read from where the truth is: the store, the shop, the SMTP sink.

:func:`collect` builds the summary (written to ``.demo/summary.json``) and checks each
figure against what the scenario did (``checks``: every one must hold for exit 0).
:mod:`demo.render` prints it for a person.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

from demo import story
from demo.observe import Observer
from demo.procs import Fleet

PAYMENT = "payments.apply_event.v1"
RECEIPT = "email.send_receipt.v2"
#: the dead letters the scenario makes: the unknown payment event and the dead mailbox
#: (permanent), and the poison message (unparseable)
EXPECTED_DEAD = {"permanent": 2, "unparseable": 1}


def _events(app: Any) -> dict[str, dict[str, int]]:
    """Audit event counters: event -> task -> count."""
    from conventions.store import counts

    out: dict[str, dict[str, int]] = {}
    for (event, task), value in counts.events(app.store.counters()).items():
        out.setdefault(event, {})[task] = value
    return out


def _shop() -> dict[str, Any]:
    from sqlalchemy import func, select

    from tasks import db, shop

    today = dt.datetime.now(dt.UTC).date()
    start = dt.datetime.combine(today, dt.time(), tzinfo=dt.UTC)
    with db.transaction() as session:
        orders = shop.Order
        report = session.get(shop.DailyReport, today)
        return {
            "orders_today": session.scalar(
                select(func.count()).where(
                    orders.created_at >= start, orders.created_at < start + dt.timedelta(days=1)
                )
            ),
            "paid": session.scalar(select(func.count()).where(orders.status == shop.PAID)),
            "paid_twice": session.scalar(
                select(func.count()).where(orders.paid_minor > orders.amount_minor)
            ),
            "receipts": shop.count_rows(session, shop.SentEmail),
            "receipt_orders": sorted(session.scalars(select(shop.SentEmail.order_id))),
            "report": None
            if report is None
            else {
                "business_date": str(report.business_date),
                "orders": report.orders,
                "revenue_minor": report.revenue_minor,
            },
        }


def _outbox() -> dict[str, Any]:
    from conventions.transactional import outbox
    from tasks import db

    return outbox.status(db.engine()).to_dict()


def _sink(folder: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines() if x]
    replies = Counter(str(line["reply"]) for line in lines)
    accepted = [line["message_id"] for line in lines if line["reply"] == 250]
    return {
        "replies": dict(replies),
        "accepted": len(accepted),
        "accepted_unique": len(set(accepted)),
    }


def _retries(events: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "task": e.task,
            "key": e.idempotency_key,
            "attempt": e.attempt,
            "delay": e.detail.get("delay"),
            "reason": e.detail.get("reason"),
        }
        for e in events
        if e.event == "retried"
    ]


def _dead_letters(app: Any) -> dict[str, Any]:
    records = app.store.list_dead_letters(limit=100)
    return {
        "by_category": dict(Counter(str(r.category) for r in records)),
        "records": [
            {
                "id": r.id,
                "task": r.task,
                "category": str(r.category),
                "key": r.idempotency_key,
                "message": r.message[:100],
                "replayed": r.replayed_at is not None,
            }
            for r in records
        ],
    }


def _log_lines(data: Path, correlation_id: str) -> dict[str, int]:
    """How many lines of each process's log carry the correlation id."""
    found = {}
    for log in sorted((data / "logs").glob("*.log")):
        count = sum(
            1 for line in log.read_text(errors="replace").splitlines() if correlation_id in line
        )
        if count:
            found[log.stem] = count
    return found


def collect(
    fleet: Fleet, observer: Observer, facts: dict[str, Any], observable: bool
) -> dict[str, Any]:
    """The summary: facts of the scenario, then what the store, shop and sink say."""
    from tasks import app

    events = _events(app)
    traced = facts["web_orders"][story.WEB_ORDERS[2][0]]["correlation_id"]  # the dead mailbox
    stories = [o["correlation_id"] for o in facts["web_orders"].values()]
    stories += facts["webhooks"]["correlation_ids"]
    audit = observer.audit(stories)
    replayed = [e for e in audit if e.event == "replayed"]
    code, trace, trace_err = fleet.cli(["trace", traced])
    out: dict[str, Any] = {
        **facts,
        "jobs": {name: sum(tasks.values()) for name, tasks in sorted(events.items())},
        "jobs_by_task": events,
        "duplicates": {
            "sent": facts["webhooks"]["duplicates_sent"],
            "absorbed_at_publish": events.get("deduplicated", {}).get(PAYMENT, 0),
            "absorbed_by_ledger": events.get("skipped_duplicate", {}).get(PAYMENT, 0),
        },
        "shop": _shop(),
        "outbox": _outbox(),
        "smtp": _sink(fleet.data / "mail"),
        "retries": _retries(audit),
        "dead_letters": _dead_letters(app),
        "replayed_events": [
            {
                "actor": e.detail.get("actor"),
                "reason": e.detail.get("reason"),
                "dead_letter_id": e.detail.get("dead_letter_id"),
                "job": e.task_id,
            }
            for e in replayed
        ],
        "trace": {"correlation_id": traced, "text": (trace or trace_err).rstrip(), "exit": code},
        "log_lines": _log_lines(fleet.data, traced),
    }
    out["duplicates"]["absorbed"] = (
        out["duplicates"]["absorbed_at_publish"] + out["duplicates"]["absorbed_by_ledger"]
    )
    if observable:
        out["queues"] = {"peaks": observer.peaks, "samples": observer.samples}
    out["checks"] = checks(out)
    return out


def checks(s: dict[str, Any]) -> dict[str, bool]:
    """Each figure the demo promises, checked against the scenario."""
    shop, smtp = s["shop"], s["smtp"]
    expected_receipts = len(story.WEB_ORDERS) + story.WEBHOOK_EVENTS
    report = s.get("report") or {}
    found = {
        "every duplicate webhook absorbed": s["duplicates"]["absorbed"] == s["duplicates"]["sent"],
        "no payment applied twice": shop["paid_twice"] == 0,
        "the relay published every outbox row": s["outbox"]["published"] == len(story.WEB_ORDERS)
        and s["outbox"]["pending"] == 0,
        "one receipt per paid order": shop["receipts"] == shop["paid"] == expected_receipts,
        "the sink got each receipt once": smtp["accepted"]
        == smtp["accepted_unique"]
        == expected_receipts,
        "a retry per transient 451": len([r for r in s["retries"] if "451" in str(r["reason"])])
        == smtp["replies"].get("451", 0)
        == story.FLAKY,
        "dead letters as scripted": s["dead_letters"]["by_category"] == EXPECTED_DEAD,
        "the replay happened, with actor and reason": [
            (e["actor"], e["reason"]) for e in s["replayed_events"]
        ]
        == [(story.REPLAY_ACTOR, story.REPLAY_REASON)],
        "the report counted every order of the day": report.get("state") == "SUCCESS"
        and (shop["report"] or {}).get("orders") == shop["orders_today"],
        "the report showed its progress": len(report.get("progress") or []) >= 2,
        "the trace tells the story": s["trace"]["exit"] == 0 and "replayed" in s["trace"]["text"],
        "yesterday's re-run succeeded": (report.get("rerun") or {}).get("state") == "SUCCESS",
    }
    if "queues" in s:  # Redis: the re-run waited behind today's report, and it showed
        heavy = s["queues"]["peaks"].get("heavy", {})
        found["the heavy queue showed its waiting job"] = heavy.get("depth", 0) >= 1
    return found

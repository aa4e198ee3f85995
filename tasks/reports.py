"""``reports.daily_sales.v1``: sum one business day's orders (the heavy lane), in chunks.

A day can hold many orders, and the job may be stopped for a deploy, killed, or retried
halfway. So it works in chunks of ``reports_chunk_rows`` orders (by order id) and keeps
a checkpoint, the last order id counted, under its idempotency key: a new delivery
continues from there instead of starting over.

Every order is counted exactly once: each chunk's sums are written as their own row
(``daily_report_chunks``, keyed by the chunk's first order id) and committed *before* the
checkpoint is saved. A crash between the two repeats that one chunk from the older
checkpoint, with the same boundaries, and its row is overwritten, never added to. The
day's report is the sum of its chunk rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from sqlalchemy import delete, func, select

from conventions import JobContext
from conventions.errors import ResumeLater
from tasks import contracts, db, shop
from tasks.celery import app
from tasks.contracts import DailySales

logger = logging.getLogger("tasks.reports")


def _window(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def _count_chunk(day: dt.date, after: str, rows: int) -> tuple[str, int] | None:
    """Sum the next ``rows`` orders after id ``after`` into their chunk row, in one
    transaction; returns (the chunk's last id, its order count), or None when done."""
    start, end = _window(day)
    with db.transaction() as session:
        found = session.execute(
            select(shop.Order.id, shop.Order.amount_minor)
            .where(shop.Order.created_at >= start, shop.Order.created_at < end)
            .where(shop.Order.id > after)
            .order_by(shop.Order.id)
            .limit(rows)
        ).all()
        if not found:
            return None
        chunk = session.get(shop.DailyReportChunk, (day, found[0].id))
        if chunk is None:
            chunk = shop.DailyReportChunk(business_date=day, first_id=found[0].id, passes=0)
            session.add(chunk)
        chunk.last_id, chunk.orders = found[-1].id, len(found)
        chunk.revenue_minor = sum(row.amount_minor for row in found)
        chunk.passes += 1
    return found[-1].id, len(found)


def _total(day: dt.date) -> int:
    start, end = _window(day)
    with db.transaction() as session:
        return int(
            session.execute(
                select(func.count()).where(
                    shop.Order.created_at >= start, shop.Order.created_at < end
                )
            ).scalar_one()
        )


def _write_report(day: dt.date) -> dict[str, int]:
    """The day's report from its chunk rows (an upsert of ``daily_reports``)."""
    with db.transaction() as session:
        chunks, orders, revenue = session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(shop.DailyReportChunk.orders), 0),
                func.coalesce(func.sum(shop.DailyReportChunk.revenue_minor), 0),
            ).where(shop.DailyReportChunk.business_date == day)
        ).one()
        report = session.get(shop.DailyReport, day)
        if report is None:
            report = shop.DailyReport(business_date=day)
            session.add(report)
        report.orders, report.revenue_minor, report.rows_counted = orders, revenue, orders
    return {"orders": int(orders), "revenue_minor": int(revenue), "chunks": int(chunks)}


@app.job(contracts.DAILY_SALES)
def daily_sales(payload: DailySales, ctx: JobContext) -> dict[str, int]:
    """Count the day's orders and revenue, chunk by chunk, resumable from a checkpoint."""
    day = payload.business_date
    rows = int(app.conf.get("reports_chunk_rows") or 1000)
    pause = float(app.conf.get("reports_chunk_pause_seconds") or 0)
    cursor: dict[str, Any] | None = ctx.checkpoint.load()
    if cursor is None:  # a fresh start: forget the chunks of any earlier run of this day
        with db.transaction() as session:
            session.execute(
                delete(shop.DailyReportChunk).where(shop.DailyReportChunk.business_date == day)
            )
        cursor = {"after": "", "done": 0}
    else:
        logger.info("daily sales of %s: resuming after order %s (%s counted)", day,
                    cursor["after"], cursor["done"])  # fmt: skip
    total = _total(day)
    after, done = str(cursor["after"]), int(cursor["done"])
    ctx.progress(done, total, "resumed" if done else "started")
    while True:
        if ctx.is_stopping():
            raise ResumeLater(f"stopped after {done} of {total} orders of {day}")
        counted = _count_chunk(day, after, rows)
        if counted is None:
            break
        after, done = counted[0], done + counted[1]
        ctx.checkpoint.save({"after": after, "done": done})
        ctx.progress(done, total, f"{done} of {total} orders")
        if pause:
            time.sleep(pause)
    report = _write_report(day)
    ctx.progress(report["orders"], report["orders"], "done")
    return report

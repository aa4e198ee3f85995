"""``reports.daily_sales.v1``: sum one business day's orders (the heavy lane)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select

from conventions import JobContext, Payload
from tasks import app, db, shop


class DailySales(Payload):
    """Which business day to report."""

    business_date: dt.date


@app.job(
    "reports.daily_sales.v1",
    payload=DailySales,
    key="daily-sales:{business_date}",
    workload="heavy",
)
def daily_sales(payload: DailySales, ctx: JobContext) -> dict[str, int]:
    """Count the day's orders and revenue into ``daily_reports`` (an upsert)."""
    start = dt.datetime.combine(payload.business_date, dt.time(), tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
    with db.transaction() as session:
        orders, revenue = session.execute(
            select(func.count(), func.coalesce(func.sum(shop.Order.amount_minor), 0)).where(
                shop.Order.created_at >= start, shop.Order.created_at < end
            )
        ).one()
        report = session.get(shop.DailyReport, payload.business_date)
        if report is None:
            report = shop.DailyReport(business_date=payload.business_date)
            session.add(report)
        report.orders, report.revenue_minor, report.rows_counted = orders, revenue, orders
    return {"orders": int(orders), "revenue_minor": int(revenue)}

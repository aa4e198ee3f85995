"""The daily sales report, sent by beat every morning for the day before."""

from __future__ import annotations

import datetime as dt

from conventions import JobContext, Payload

from tasks import app

#: the reports made, by business date (stands for the shop's reports table)
MADE: list[dt.date] = []


class DailySales(Payload):
    business_date: dt.date


@app.job(
    "reports.daily_sales.v1",
    payload=DailySales,
    key="daily-sales:{business_date}",
    workload="reports",
)
def daily_sales(payload: DailySales, ctx: JobContext) -> str:
    MADE.append(payload.business_date)
    return f"sales of {payload.business_date}"

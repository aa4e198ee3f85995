"""Beat's entries in the demo (``CONVENTIONS_SCHEDULE=demo.schedule:ENTRIES``).

The reference app's ``daily-sales`` runs at 03:00 in Bangkok for the day before; the demo
cannot wait for that. Its entry occurs daily at midnight UTC for the day that begins, with
a day of catch-up: a beat started at any time of the day sends today's occurrence at
once, exactly once (its business key is ``beat:demo-daily-sales:<date>``).
"""

from __future__ import annotations

from conventions.schedules import entries as schedules

ENTRIES = [
    schedules.Entry(
        "demo-daily-sales",
        "reports.daily_sales.v1",
        schedules.daily(at="00:00", tz="UTC"),
        payload=schedules.business_date(days=0),
        overlap="skip",
        catch_up=86400,
    ),
]

"""What beat sends: the sales report at 06:00 Paris time, for the day before."""

from __future__ import annotations

from conventions.schedules.entries import Entry, business_date, daily, succeeds_by

ENTRIES = [
    Entry(
        "daily-sales",
        "reports.daily_sales.v1",
        daily("06:00", tz="Europe/Paris"),
        payload=business_date(days=-1),
        expect=succeeds_by("07:00"),  # the watchdog alarms when it has not by then
    ),
]

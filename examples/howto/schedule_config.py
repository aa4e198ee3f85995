"""The schedule part of a project's ``celeryconfig.py`` (docs/howto/schedules.md)."""

from __future__ import annotations

from conventions.schedules import entries as schedules
from conventions.schedules import watchdog

SCHEDULE = [
    schedules.Entry(
        "daily-sales",
        "reports.daily_sales.v1",
        schedules.daily(at="03:00", tz="Asia/Bangkok"),
        payload=schedules.business_date(days=-1),  # the Bangkok day that just ended
        overlap="allow",
        catch_up=6 * 3600,
        expect=schedules.succeeds_by("04:00"),
    ),
    schedules.Entry(
        "sync-stock",
        "shop.sync_stock.v1",
        schedules.every(minutes=5),
        payload={"warehouse_id": "wh_1"},
        overlap="skip",
        expect=schedules.succeeds_within(minutes=15),
    ),
    watchdog.entry(),  # ops.watchdog.v1, every minute
]
beat_scheduler = "conventions.schedules.beat:Scheduler"
conventions_schedule = SCHEDULE  # or "myproject.schedule:ENTRIES"

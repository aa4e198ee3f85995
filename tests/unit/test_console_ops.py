"""The console's operator helpers without a server: a dead letter's cause and folded
traceback, a schedule's cadence in words, the charts drawn from per-minute samples,
the key forms a search accepts, a payload read back from its key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conventions.console import cadence, charts, views
from conventions.ops.rerun import payload_from_key
from conventions.schedules import cadence as schedule_cadence
from conventions.store import series
from conventions.store.key_forms import same_key as key_matches
from tasks import app

TRACEBACK = """Traceback (most recent call last):
  File "/srv/.venv/lib/python3.12/site-packages/celery/app/trace.py", line 453, in trace_task
    R = retval = fun(*args, **kwargs)
  File "/srv/.venv/lib/python3.12/site-packages/conventions/worker/run.py", line 120, in run
    return body(payload, ctx)
  File "/srv/app/billing/tasks.py", line 31, in charge_invoice
    provider.charge(invoice)
  File "/srv/app/billing/provider.py", line 12, in charge
    raise CardDeclined("card declined: insufficient funds")
billing.provider.CardDeclined: card declined: insufficient funds"""


def test_a_traceback_opens_on_the_users_code_with_the_layers_and_celerys_frames_folded() -> None:
    runs = views.frames(TRACEBACK)
    assert [folded for folded, _ in runs] == [False, True, False]
    assert "celery/app/trace.py" in runs[1][1] and "conventions/worker/run.py" in runs[1][1]
    assert runs[2][1].startswith('  File "/srv/app/billing/tasks.py"')
    assert runs[2][1].endswith("CardDeclined: card declined: insufficient funds")


def test_a_dead_letters_message_is_the_exceptions_own_line() -> None:
    reason = "permanent: the provider refused (billing.provider.CardDeclined)"
    cause = views.cause("CardDeclined", reason, TRACEBACK)
    assert cause == "billing.provider.CardDeclined: card declined: insufficient funds"
    assert views.cause("PayloadError", "field required: invoice_id", "") == (
        "PayloadError: field required: invoice_id"
    )


def test_a_schedules_cadence_reads_as_words() -> None:
    assert cadence.words(schedule_cadence.daily("02:00", "Europe/Berlin")) == (
        "daily at 02:00 Europe/Berlin"
    )
    assert cadence.words(schedule_cadence.every(minutes=5)) == "every 5 minutes"
    assert cadence.words(schedule_cadence.every(minutes=1)) == "every minute"
    assert cadence.words(schedule_cadence.every(seconds=7200)) == "every 2 hours"
    weekly = schedule_cadence.crontab("30", "6", day_of_week="1,5", tz="UTC")
    assert cadence.words(weekly) == "every Monday, Friday at 06:30 UTC"
    assert cadence.words(schedule_cadence.crontab("*/15")) == "every 15 minutes"
    assert cadence.words(schedule_cadence.crontab("5")) == "hourly at minute 5"
    odd = schedule_cadence.crontab("0", "9-17", day_of_week="1-5")
    assert cadence.words(odd) == "cron 0 9-17 * * 1-5 (UTC)"
    now = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
    assert cadence.until(now + timedelta(hours=3, minutes=5), now) == "in 3 h 05 min"


def test_a_chart_counts_the_increases_between_samples_and_breaks_at_a_gap() -> None:
    start = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
    samples = [
        (start, {"email": {"succeeded": 100, "oldest": 2.0}}),
        (start + timedelta(minutes=1), {"email": {"succeeded": 130, "oldest": 9.0}}),
        (start + timedelta(minutes=2), {"email": {"succeeded": 131, "oldest": 0.0}}),
        # minute 3 was not sampled; the store was emptied before minute 4
        (start + timedelta(minutes=4), {"email": {"succeeded": 5, "oldest": 1.0}}),
    ]
    line = charts.binned(samples, "succeeded", start, timedelta(minutes=1), 5)["email"]
    assert line == [0.0, 30.0, 1.0, None, 0.0]
    ages = charts.binned(samples, series.OLDEST, start, timedelta(minutes=1), 5)["email"]
    assert ages == [2.0, 9.0, 0.0, None, 1.0]
    day = charts.binned(samples, "succeeded", start, timedelta(minutes=15), 1)["email"]
    assert day == [31.0]
    # a sample before the range gives the first bin its increase, and is not drawn
    later = charts.binned(
        samples, "succeeded", start + timedelta(minutes=1), timedelta(minutes=1), 2
    )
    assert later["email"] == [30.0, 1.0]


def test_a_chart_is_inline_svg_with_every_queue_name_escaped() -> None:
    start = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
    hostile = '"><script>alert(1)</script>'
    samples = [(start + timedelta(minutes=i), {hostile: {"succeeded": i * 3}}) for i in range(5)]
    drawn = charts.charts(samples, start + timedelta(minutes=4), "hour")
    assert [c.field for c in drawn] == ["succeeded", "failed", "retried", "oldest"]
    svg = str(charts.svg(drawn[0], [hostile]))
    assert svg.startswith("<svg") and "<script>" not in svg and "&lt;script&gt;" in svg
    assert drawn[0].total == {hostile: 12.0}
    assert "style=" not in svg  # colours come from the stylesheet (the CSP allows no inline style)


def test_a_key_search_matches_either_form_of_a_records_key() -> None:
    task = "billing.charge_invoice.v1"
    held = "billing.charge_invoice:charge:inv_4004"
    assert key_matches(task, held, "charge:inv_4004")
    assert key_matches(task, held, held)
    assert key_matches(task, "charge:inv_4004", held)
    assert not key_matches(task, held, "charge:inv_4005")


def test_a_payload_is_read_back_from_a_key_that_names_all_of_it() -> None:
    echo = app.tasks["payments.apply_event.v1"]
    key = echo.key.format(event_id="evt_42") if isinstance(echo.key, str) else None
    assert key is not None
    assert payload_from_key(echo, key) == {"event_id": "evt_42"}
    assert payload_from_key(echo, "something:else:entirely") is None

"""Trigger-and-poll with FastAPI: start a report, answer 202 at once, poll its run.

Run it next to a worker (``celery -A tasks worker -Q email,heavy``)::

    uvicorn examples.fastapi_runs:api --port 8000
    curl -X POST localhost:8000/reports/daily-sales/2026-01-02   # {"run_id": ..., "poll": ...}
    curl localhost:8000/runs/<run_id>                            # {"state": "running", ...}

The request never waits for the job: the page polls ``/runs/<id>`` every second or two
and draws ``progress`` until ``state`` is ``succeeded`` or ``failed``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import FastAPI

from conventions import bind
from conventions.contrib.polling import run_state, trigger
from tasks import app as celery_app
from tasks.reports import daily_sales

api = FastAPI(title="trigger-and-poll example")


@api.post("/reports/daily-sales/{business_date}", status_code=202)
def start_daily_sales(business_date: dt.date) -> dict[str, str]:
    """Publish the report and return its run id at once (a double click gets the
    same run: the key deduplicates while the first is pending)."""
    with bind():  # a correlation id per web request
        run_id = trigger(daily_sales, business_date=business_date)
    return {"run_id": run_id, "poll": f"/runs/{run_id}"}


@api.get("/runs/{run_id}")
def poll_run(run_id: str) -> dict[str, Any]:
    """The run's state, progress and, once finished, result or error type."""
    return run_state(celery_app, run_id).as_dict()

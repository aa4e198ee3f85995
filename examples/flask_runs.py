"""Flask: a correlation context per request, and trigger-and-poll (a tested example).

Run it next to a worker (``celery -A tasks worker -Q email,heavy``)::

    flask --app examples.flask_runs run --port 8000
    curl -X POST localhost:8000/reports/daily-sales/2026-01-02   # {"run_id": ..., "poll": ...}
    curl localhost:8000/runs/<run_id>                            # {"state": "running", ...}
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Flask

from conventions.contrib.polling import run_state, trigger
from conventions.contrib.web import WSGIMiddleware
from tasks import app as celery_app
from tasks.reports import daily_sales

app = Flask(__name__)
app.wsgi_app = WSGIMiddleware(  # type: ignore[method-assign]
    app.wsgi_app, actor=lambda environ: environ.get("HTTP_X_USER_ID")
)


@app.post("/reports/daily-sales/<business_date>")
def start_daily_sales(business_date: str) -> tuple[dict[str, str], int]:
    """Publish the report under the request's correlation id; answer 202 at once."""
    run_id = trigger(daily_sales, business_date=dt.date.fromisoformat(business_date))
    return {"run_id": run_id, "poll": f"/runs/{run_id}"}, 202


@app.get("/runs/<run_id>")
def poll_run(run_id: str) -> dict[str, Any]:
    """The run's state and progress, for a progress bar."""
    return run_state(celery_app, run_id).as_dict()

"""A long job: import a supplier's feed row by row, stopping cleanly during a deploy."""

from __future__ import annotations

from conventions import Id, JobContext, Payload
from conventions.errors import ResumeLater

from tasks import app

#: the feeds' rows (stands for the supplier's file)
FEEDS: dict[str, list[str]] = {}
#: the rows imported, in order (stands for the catalog table)
IMPORTED: list[str] = []


class FeedImport(Payload):
    feed_id: Id


@app.job("catalog.import_feed.v1", payload=FeedImport, key="import:{feed_id}", workload="reports")
def import_feed(payload: FeedImport, ctx: JobContext) -> int:
    rows = FEEDS[payload.feed_id]
    start = int((ctx.checkpoint.load() or {}).get("row", 0))
    for number in range(start, len(rows)):
        IMPORTED.append(rows[number])
        ctx.checkpoint.save({"row": number + 1})
        ctx.progress(number + 1, len(rows))
        if ctx.is_stopping() and number + 1 < len(rows):
            raise ResumeLater(f"stopped after row {number + 1}")
    return len(rows)

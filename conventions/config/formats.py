"""The version of every wire and storage format the layer writes, in one table.

A reader checks the version of what it meets: the version it writes and every older one
down to ``READS_FROM`` it reads; a newer one it refuses loudly (a dead letter with the
reason, or a doctor error), never misreads. A format's version moves only when its shape
changes in a way an older reader would misread (docs/reference/compatibility.md).
"""

from __future__ import annotations

from typing import Final

#: the message headers the layer writes (``cc_*``) and the payload envelope around them
HEADERS: Final = 1
#: the transport's Redis key layout (``conventions.transport.layout``)
TRANSPORT_LAYOUT: Final = 1
#: the store's record shapes on Redis (ledger, reservations, runs, audit, dead letters)
STORE_REDIS: Final = 1
#: the SQL store's schema (tables and columns; ``conventions migrate`` moves it)
STORE_SQL: Final = 1
#: the transactional outbox's row
OUTBOX_ROW: Final = 1

#: the oldest version of each format this release still reads (one minor version back)
READS_FROM: Final = {
    "headers": 1,
    "transport_layout": 1,
    "store_redis": 1,
    "store_sql": 1,
    "outbox_row": 1,
}

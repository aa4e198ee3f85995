"""Work committed in the caller's own transaction: the outbox, its relay, once().

The modules of this package need the ``sql`` extra (SQLAlchemy); this one does not, so
that the relay's defaults can be read (the CLI's options) without it.
"""

from __future__ import annotations

from datetime import timedelta

#: rows claimed per batch
DEFAULT_BATCH = 100
#: how long published rows are kept before they are purged
DEFAULT_RETENTION = timedelta(days=7)
#: seconds between two looks at an empty outbox
DEFAULT_POLL_INTERVAL = 1.0
#: the relay's wait while the broker is unreachable: doubles from 0.5 s up to the cap
DEFAULT_MAX_BACKOFF = 30.0
#: publish attempts of a row failing for its own reason before it is dead-lettered
DEFAULT_MAX_ATTEMPTS = 10

"""Imported by a worker subprocess (``-I``) to play the next release of the layer: one
that writes and reads message format ``HEADERS + 1`` (``conventions.config.formats``).

Only the version moves: enough to see an older worker refuse the newer release's
messages and a worker of the newer release run them.
"""

from __future__ import annotations

from conventions.config import formats

setattr(formats, "HEADERS", formats.HEADERS + 1)  # noqa: B010  (a Final, on purpose)

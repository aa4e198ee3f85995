"""``python -m conventions ...``: the ``conventions`` command (see ``conventions.cli``)."""

from __future__ import annotations

import sys

from conventions.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m conventions ...``: the ``conventions`` command (see ``conventions.cli.main``)."""

from __future__ import annotations

import sys

from conventions.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

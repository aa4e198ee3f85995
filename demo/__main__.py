"""``python -m demo [--embedded]``."""

from __future__ import annotations

import sys

from demo.run import main

sys.exit(main(sys.argv[1:]))

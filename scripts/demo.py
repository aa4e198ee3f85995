"""``make demo``: the main job, through real processes (see the ``demo`` package).

``python scripts/demo.py [--embedded]`` is ``python -m demo``: it picks Redis when one is
configured or answers on localhost (databases ``DEMO_REDIS_DBS``, default ``3,4``), else
the embedded default, plays the shop's day, prints the summary, writes
``.demo/summary.json`` and stops every process it started.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the ``demo`` package, before this script's own folder

from demo.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

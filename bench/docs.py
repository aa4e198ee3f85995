"""``python -m bench.docs [--check] [PAGE ...]``: the docs' bench tables, made from the
result files.

A docs page marks each table of bench figures::

    <!-- bench:scale-costs file=bench/results/scale.json -->
    (the table: written by this command, never by hand)
    <!-- /bench:scale-costs -->

The name is one of :data:`TABLES`, ``file`` is the result file it shows
(relative to the repository), and any other ``key=value`` goes to the table's function
(``variant=quiet``). This command rewrites every marked block of the pages (every
``docs/**/*.md`` unless pages are named) from the files as they are; ``--check`` changes
nothing and exits 1 when a block differs from what its file makes (the unit test
``tests/unit/test_bench_docs.py`` does the same).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from bench import results, tables, tables_scale

ROOT = Path(__file__).resolve().parent.parent
#: one marked block: its table's name, its attributes, its body, its end marker
BLOCK = re.compile(
    r"(?P<open><!-- bench:(?P<name>[\w-]+)(?P<attrs>(?: [\w-]+=\S+)*) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- /bench:(?P=name) -->)",
    re.DOTALL,
)
#: every table a marker may name: the cost count's and the cluster runs'
TABLES: dict[str, tables.Table] = {**tables.TABLES, **tables_scale.TABLES}


class MarkerError(ValueError):
    """A marker names a table or a file that does not exist, or has no ``file=``."""


def _attrs(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split())


def table(name: str, attrs: dict[str, str], root: Path = ROOT) -> str:
    """The body a block ``<!-- bench:NAME attrs -->`` must hold."""
    if name not in TABLES:
        raise MarkerError(f"bench:{name}: no such table (one of {', '.join(TABLES)})")
    options = dict(attrs)
    path = options.pop("file", None)
    if path is None:
        raise MarkerError(f"bench:{name}: the marker names no file= (the result it shows)")
    if not (root / path).is_file():
        raise MarkerError(f"bench:{name}: {path} does not exist (run the bench that writes it)")
    lines = TABLES[name](results.read(root / path), **options)
    return "\n".join(lines) + "\n"


def render(text: str, root: Path = ROOT) -> str:
    """``text`` with every marked block's body made from its file."""

    def fill(match: re.Match[str]) -> str:
        body = table(match["name"], _attrs(match["attrs"]), root)
        return f"{match['open']}{body}{match['close']}"

    return BLOCK.sub(fill, text)


def blocks(text: str) -> list[tuple[str, dict[str, str]]]:
    """The marked blocks of a page: each table's name and attributes."""
    return [(m["name"], _attrs(m["attrs"])) for m in BLOCK.finditer(text)]


def pages(root: Path = ROOT) -> list[Path]:
    """The docs pages that hold at least one marked block."""
    return sorted(p for p in (root / "docs").rglob("*.md") if BLOCK.search(p.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.docs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pages", nargs="*", type=Path, help="default: every docs page")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a diff")
    args = parser.parse_args(argv)
    stale = 0
    for page in args.pages or pages():
        text = page.read_text()
        made = render(text)
        if made == text:
            continue
        stale += 1
        if args.check:
            old, new = text.splitlines(True), made.splitlines(True)
            sys.stdout.writelines(difflib.unified_diff(old, new, str(page), "from its files"))
        else:
            page.write_text(made)
            print(f"rewrote {page}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs' Python is real code: every block compiles, and a how-to's blocks are files.

A ```python block of a how-to (``docs/howto/``) is preceded by one marker line:

- ``<!-- example: examples/howto/x.py -->``: the block is that whole file, byte for byte;
- ``<!-- excerpt: examples/howto/x.py -->``: the block appears verbatim in that file;
- ``<!-- fragment -->``: a few lines that only make sense in a page (a settings line, a
  call in a body); it must still compile.

The files are imported and run by this module and by
``tests/integration/test_howto_examples.py``: a sample that stops working fails there.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^(?:<!-- (?P<marker>[^>]*?) -->\n)?```python\n(?P<code>.*?)^```$", re.M | re.S)
MARKER = re.compile(r"^(?:(?P<kind>example|excerpt): (?P<path>examples/\S+\.py)|fragment)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    marker: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks() -> list[Block]:
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            out.append(Block(page, line, match.group("marker"), match.group("code")))
    return out


BLOCKS = python_blocks()
HOWTO_BLOCKS = [b for b in BLOCKS if b.page.parent.name == "howto"]


def test_the_docs_have_python_blocks_and_the_howtos_have_full_examples() -> None:
    assert len(BLOCKS) > 30
    assert sum(1 for b in HOWTO_BLOCKS if (b.marker or "").startswith("example:")) >= 3


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_every_python_block_in_the_docs_compiles(block: Block) -> None:
    try:
        ast.parse(block.code)
    except SyntaxError as exc:
        pytest.fail(f"{block}: the block does not parse ({exc.msg}, its line {exc.lineno})")


@pytest.mark.parametrize("block", HOWTO_BLOCKS, ids=str)
def test_every_howto_block_is_an_example_file_an_excerpt_of_one_or_a_fragment(
    block: Block,
) -> None:
    found = MARKER.match(block.marker or "")
    assert found, (
        f"{block}: put '<!-- example: examples/... -->', '<!-- excerpt: examples/... -->' "
        "or '<!-- fragment -->' on the line before the block"
    )
    if found.group("kind") is None:
        return
    source = ROOT / found.group("path")
    assert source.is_file(), f"{block}: {source.relative_to(ROOT)} does not exist"
    if found.group("kind") == "example":
        assert block.code == source.read_text(), (
            f"{block}: the block differs from {found.group('path')}: copy the file into the page"
        )
    else:
        assert block.code in source.read_text(), (
            f"{block}: the block is not a verbatim part of {found.group('path')}"
        )


def imported(path: str, source: str) -> bool:
    """Does ``source`` import the module of ``path`` (``import a.b.c``, ``from a.b.c
    import x`` or ``from a.b import c``)?"""
    package, _, name = path.removesuffix(".py").replace("/", ".").rpartition(".")
    if re.search(rf"\b{re.escape(package)}\.{name}\b", source):
        return True
    return re.search(rf"from {re.escape(package)} import [^\n]*\b{name}\b", source) is not None


def test_every_example_file_a_howto_shows_is_imported_by_a_test() -> None:
    shown = {
        MARKER.match(b.marker or "").group("path")  # type: ignore[union-attr]
        for b in HOWTO_BLOCKS
        if (b.marker or "").startswith(("example:", "excerpt:"))
    }
    tests = "".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    unused = sorted(path for path in shown if not imported(path, tests))
    assert shown and not unused, f"no test imports {unused}: import and run them"

"""The docs' bench tables are what ``python -m bench.docs`` makes from the result files
they name (no bench runs here: files only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import docs, results

ROOT = Path(__file__).resolve().parents[2]
#: the tables each page must carry (a page that lost its markers would pass vacuously)
EXPECTED = {
    "docs/discussions/performance.md": {"bench", "scale-costs", "scale-ratios"},
    "docs/discussions/at-scale.md": {"scale-costs", "scale-trips", "scale-capacity",
                                     "scale-keep", "scale-cluster-shards",
                                     "scale-cluster-capacity", "scale-cluster-instructions",
                                     "scale-rabbit-replication",
                                     "fleet-idle", "fleet-sweep"},
    "docs/reference/settings.md": {"scale-sizing"},
}  # fmt: skip


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_every_bench_table_in_the_docs_is_what_its_result_file_makes(page: str) -> None:
    text = (ROOT / page).read_text()
    assert {name for name, _ in docs.blocks(text)} >= EXPECTED[page]
    made = docs.render(text, ROOT)
    assert made == text, f"{page} differs from its result files: run `python -m bench.docs`"


def test_every_marked_page_is_checked_and_names_a_kept_result_file() -> None:
    assert {str(p.relative_to(ROOT)) for p in docs.pages(ROOT)} == set(EXPECTED)
    for page in EXPECTED:
        for name, attrs in docs.blocks((ROOT / page).read_text()):
            assert attrs["file"].startswith("bench/results/"), (page, name)


def _copy(tmp_path: Path) -> tuple[Path, str]:
    """A repository of one page and its result file, to change."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    shutil.copy(results.SCALE, tmp_path / "bench" / "results" / "scale.json")
    page = (
        "<!-- bench:scale-ratios file=bench/results/scale.json -->\n"
        "old\n<!-- /bench:scale-ratios -->\n"
    )
    return tmp_path, page


def test_a_table_edited_by_hand_or_a_changed_result_file_is_a_difference(tmp_path: Path) -> None:
    root, page = _copy(tmp_path)
    made = docs.render(page, root)
    assert made != page and "conv" in made
    assert docs.render(made, root) == made  # made once, stable
    edited = made.replace("x |", "x (by hand) |", 1)
    assert docs.render(edited, root) != edited
    data = json.loads((root / "bench/results/scale.json").read_text())
    data["ratios"][0]["cpu"] += 1
    (root / "bench/results/scale.json").write_text(json.dumps(data))
    assert docs.render(made, root) != made


def test_a_marker_without_its_file_or_with_an_unknown_table_is_refused(tmp_path: Path) -> None:
    root, _ = _copy(tmp_path)
    missing = "<!-- bench:bench file=bench/results/none.json -->\n<!-- /bench:bench -->"
    with pytest.raises(docs.MarkerError, match="does not exist"):
        docs.render(missing, root)
    with pytest.raises(docs.MarkerError, match="no such table"):
        docs.render("<!-- bench:nope file=bench/results/scale.json -->\n<!-- /bench:nope -->", root)
    with pytest.raises(docs.MarkerError, match="no file="):
        docs.render("<!-- bench:bench -->\n<!-- /bench:bench -->", root)

"""The layering check (scripts/check_layering.py) on the real tree, and on trees made to fail."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_layering", ROOT / "scripts/check_layering.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _checker()


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_layer_has_no_circle_no_reference_app_import_and_keeps_its_foundation() -> None:
    assert check.problems(ROOT) == []


def test_a_circle_closed_under_type_checking_is_still_a_circle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "conventions/__init__.py": "",
        "conventions/worker/__init__.py": "",
        "conventions/worker/a.py": "from conventions.worker import b\n",
        "conventions/worker/b.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from conventions.worker.a import X
        """,
    })  # fmt: skip
    assert check.problems(root) == ["import circle: conventions.worker.a <-> conventions.worker.b"]


def test_a_circle_closed_inside_a_function_is_still_a_circle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "conventions/__init__.py": "",
        "conventions/app.py": "from conventions import task\n",
        "conventions/task.py": "def f():\n    from conventions.app import App\n",
    })  # fmt: skip
    assert check.problems(root) == ["import circle: conventions.app <-> conventions.task"]


def test_a_foundation_package_that_imports_upward_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "conventions/__init__.py": "",
        "conventions/store/__init__.py": "",
        "conventions/store/redis.py": "from conventions.worker.delivery import run\n",
        "conventions/worker/__init__.py": "",
        "conventions/worker/delivery.py": "run = 1\n",
    })  # fmt: skip
    assert check.problems(root) == [
        "conventions.store.redis imports conventions.worker.delivery: store sits below worker"
    ]


def test_the_reference_app_and_the_cli_are_off_limits(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "conventions/__init__.py": "",
        "conventions/cli/__init__.py": "",
        "conventions/cli/main.py": "x = 1\n",
        "conventions/ops/__init__.py": "",
        "conventions/ops/doctor.py": "import tasks\nfrom conventions.cli import main\n",
    })  # fmt: skip
    found = check.problems(root)
    assert any(line.endswith("ops/doctor.py:1: imports tasks") for line in found), found
    assert (
        "conventions.ops.doctor imports conventions.cli.main: only ['__main__', 'cli'] may" in found
    )


def test_a_package_importing_its_own_children_is_not_a_circle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "conventions/__init__.py": "",
        "conventions/store/__init__.py": "from conventions.store.redis import R\n",
        "conventions/store/redis.py": "from conventions.store import keys\nR = 1\n",
        "conventions/store/keys.py": "",
    })  # fmt: skip
    assert check.problems(root) == []

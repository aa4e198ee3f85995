"""Fail when the layer imports the reference app: `conventions` never imports `tasks`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def offenders(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "conventions").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name == "tasks" or name.startswith("tasks.") or name == "celeryconfig":
                    found.append(f"{path}:{node.lineno}: imports {name}")
    return found


if __name__ == "__main__":
    bad = offenders(Path(__file__).resolve().parents[1])
    print("\n".join(bad) or "layering: conventions imports neither tasks nor celeryconfig")
    sys.exit(1 if bad else 0)

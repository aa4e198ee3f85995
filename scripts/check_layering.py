"""The layering of ``conventions``, checked (``make test`` runs it).

Three rules, over every import a module makes: at the top, under ``TYPE_CHECKING`` and
inside functions alike (an import circle closed any of those ways is still a circle):

1. ``conventions`` never imports the reference app (``tasks``, ``celeryconfig``).
2. No import circle between the layer's modules.
3. The foundation subpackages form layers: each imports only from the layers below it
   (``FOUNDATION``). Nothing but ``conventions.cli`` (and ``__main__``) imports the CLI,
   and nothing in the layer imports ``conventions.contrib``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

#: the foundation, bottom up: a subpackage imports only from the layers before its own
FOUNDATION: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    frozenset({"config"}),
    frozenset({"store"}),
    frozenset({"jobs", "tracing"}),
    frozenset({"observability"}),
    frozenset({"transport", "capacity"}),
)
#: what only the command line and the integrations import
CONSUMERS = {"cli": {"cli", "__main__"}, "contrib": {"contrib"}}


def modules(root: Path) -> dict[str, Path]:
    """``conventions.x.y`` -> its file."""
    found = {}
    for path in sorted((root / "conventions").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(
    name: str, path: Path, tree: ast.AST, known: dict[str, Path]
) -> Iterator[tuple[str, int]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:  # ``from conventions.x import y``: y may be a module
                submodule = f"{module}.{alias.name}"
                yield (submodule if submodule in known else module), node.lineno


def graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The import graph between the layer's modules, and the imports of ``tasks``."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    reference_app = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _imported(name, path, tree, known):
            head = target.partition(".")[0]
            if head in ("tasks", "celeryconfig"):
                reference_app.append(f"{path}:{line}: imports {target}")
            # a module's own packages are imported before it anyway: not an edge
            elif target in known and not name.startswith(f"{target}.") and target != name:
                edges[name].add(target)
    return edges, reference_app


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def subpackage(module: str) -> str:
    """``conventions.store.redis`` -> ``store``; a top-level module is its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_breaks(edges: dict[str, set[str]]) -> list[str]:
    """Imports that go up or across the foundation, or into the CLI or contrib."""
    level = {name: i for i, group in enumerate(FOUNDATION) for name in group}
    breaks = []
    for source, targets in sorted(edges.items()):
        here = subpackage(source)
        for target in sorted(targets):
            there = subpackage(target)
            if here == there:
                continue
            if here in level and (there not in level or level[there] >= level[here]):
                breaks.append(f"{source} imports {target}: {here} sits below {there}")
            allowed = CONSUMERS.get(there)
            if allowed is not None and here not in allowed:
                breaks.append(f"{source} imports {target}: only {sorted(allowed)} may")
    return breaks


def problems(root: Path) -> list[str]:
    edges, reference_app = graph(root)
    found = list(reference_app)
    found += [f"import circle: {' <-> '.join(c)}" for c in circles(edges)]
    found += layer_breaks(edges)
    return found


if __name__ == "__main__":
    bad = problems(Path(__file__).resolve().parents[1])
    print(
        "\n".join(bad)
        or "layering: no tasks/celeryconfig import, no import circle, foundation layers kept"
    )
    sys.exit(1 if bad else 0)

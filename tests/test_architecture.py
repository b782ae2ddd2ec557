"""Dependencies point one way (app -> engine -> kernels) and no modules import each other in a circle.

The imports are read from the source: every `import` and `from ... import`, lazy ones inside functions and
annotation-only ones under `if TYPE_CHECKING:` too (a circle of types is still a circle a reader must hold in
mind), so a back-arrow or a circle fails here whether or not a test happens to import the modules in the order
that would break. `from package import name` runs the package's `__init__`, so it depends on the package as
well as on the module `name`: a package that re-exports its modules cannot also be imported that way by them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "kernels")
LAYER = {"app": 2, "engine": 1, "kernels": 0}  # a package may import only packages of a lower layer


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (a `from package import x` counts x when x is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from p import m` runs p's __init__ and then takes m: it depends on both
            targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_package_imports_a_higher_layer():
    back = sorted(
        (a, b) for a, deps in graph().items() for b in deps if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]
    )
    assert back == [], f"imports against app -> engine -> kernels: {back}"


def test_the_window_reaches_the_engine_only_through_the_service():
    # app.service is the GUI's one way to the engine (the Backend seam: a remote server stands in for it)
    direct = sorted(
        (a, b) for a, deps in graph().items() if a.startswith("app.ui") for b in deps if b.startswith("engine")
    )
    assert direct == [], f"app.ui modules importing the engine (go through app.service): {direct}"


MAX_LINES = 600  # a file past this holds more than one idea: split it by concept (docs/architecture.md)


def test_no_file_is_over_600_lines():
    long = sorted(
        (n, str(path.relative_to(ROOT)))
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert long == [], f"files over {MAX_LINES} lines: {long}"


def test_no_import_cycles():
    edges = graph()
    cycles = [c for c in _strongly_connected(edges) if len(c) > 1]
    assert cycles == [], "modules importing each other in a circle: " + "; ".join(
        " <-> ".join(sorted(c)) for c in cycles
    )


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the module graph is deep enough to trouble recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found

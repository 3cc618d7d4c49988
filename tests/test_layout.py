"""The package's shape, read from its source with ``ast``: no import circles among growtool's
modules, ``nn/`` imports only itself, ``grow/`` nothing of ``io/`` or ``training/``, ``io/`` nothing
of ``grow/`` or ``training/``, and every module (the architecture table aside) under 600 lines.
Imports under ``if TYPE_CHECKING:`` are type hints only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "growtool"
EXEMPT = {"growtool.nn.families"}  # the architecture table: data, one entry per family
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The growtool modules ``name`` imports (anywhere in the file, functions included)."""
    tree = ast.parse(path.read_text())
    skip, found = type_checking_nodes(tree), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t != "growtool":
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


def test_no_import_circles():
    g, state, circles = graph(), {}, []

    def visit(n, stack):
        state[n] = "open"
        for m in sorted(g[n]):
            if state.get(m) == "open":
                circles.append(stack[stack.index(m) :] + [m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = "done"

    for n in sorted(g):
        if n not in state:
            visit(n, [n])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_parts_import_only_what_the_rules_allow():
    bad = []
    for n, deps in graph().items():
        for d in deps:
            if n.startswith("growtool.nn") and not d.startswith("growtool.nn"):
                bad.append(f"{n} -> {d} (nn/ imports only nn/)")
            if n.startswith("growtool.grow") and d.startswith(("growtool.io", "growtool.training")):
                bad.append(f"{n} -> {d} (grow/ never imports io/ or training/)")
            if n.startswith("growtool.io") and d.startswith(("growtool.grow", "growtool.training")):
                bad.append(f"{n} -> {d} (io/ knows nothing of growth or training)")
    assert not bad, "\n".join(sorted(bad))


def test_every_module_is_under_600_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items() if n not in EXEMPT}
    assert not {n: k for n, k in long.items() if k >= MAX_LINES}, sorted(long.items(), key=lambda x: -x[1])[:5]


def test_the_checker_sees_imports():  # the tests above would pass vacuously on an empty graph
    g = graph()
    assert "growtool.nn.model" in g["growtool.check"] and "growtool.io.checkpoint" in g["growtool.surgery"]
    assert "growtool.nn.config" in g["growtool.nn.model"]  # relative imports inside nn/ resolve

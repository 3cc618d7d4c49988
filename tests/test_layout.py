"""The package's shape, read from its source with ``ast``: no import circles among growtool's
modules (imports under ``if TYPE_CHECKING:`` count: a type hint is an arrow too), ``nn/`` imports
only itself, ``grow/`` nothing of ``io/`` or ``training/``, ``io/`` nothing of ``grow/`` or
``training/``; every module (the architecture table aside) under 600 lines; one import path per
name (no module re-exports another's names); every module in docs/growth.md's code map; functions
of at most 60 lines and 8 parameters, click commands and the listed exceptions aside."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "growtool"
EXEMPT = {"growtool.nn.families"}  # the architecture table: data, one entry per family
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The growtool modules ``name`` imports (anywhere in the file, functions and type hints included)."""
    tree = ast.parse(path.read_text())
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
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


# ---- one import path per name ----------------------------------------------------------------

ROOT = PKG.parent
CALLERS = [*PKG.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")]


def defined(path: Path) -> set[str]:
    """The names a module binds itself: functions, classes, assignments (any depth, ``global`` too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Global):
            names |= set(node.names)
    return names


def borrowed(path: Path, mods: dict, own: dict) -> list[str]:
    """``from M import n`` and ``M.n`` in ``path`` where growtool module M does not define ``n``
    (``n`` is then another module's name, reached through M). A module alias assigned to in the
    file is a local variable there and is not followed."""
    tree, aliases, found = ast.parse(path.read_text()), {}, []
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("growtool"):
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif node.module in mods and node.module != "growtool" and a.name not in own[node.module]:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            m = aliases[node.value.id]
            if node.value.id not in stored and node.attr not in own[m] and f"{m}.{node.attr}" not in mods:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {m}.{node.attr}")
    return found


def test_no_module_re_exports_another_modules_names():
    mods = modules()
    own = {n: defined(p) for n, p in mods.items()}
    bad = [b for path in CALLERS for b in borrowed(path, mods, own)]
    for n, p in mods.items():  # __all__ names only the module's own names
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                bad += [
                    f"{n}.__all__: {e.value}"
                    for e in node.value.elts
                    if isinstance(e, ast.Constant) and e.value not in own[n]
                ]
    assert not bad, "names reached through a module that does not define them:\n" + "\n".join(bad)


def test_the_re_export_check_sees_a_borrowed_name(tmp_path):  # so the test above cannot pass vacuously
    mods = modules()
    own = {n: defined(p) for n, p in mods.items()}
    f = tmp_path / "x.py"
    lines = ["from growtool.io.checkpoint import atomic_file, load", "from growtool.io import checkpoint"]
    f.write_text("\n".join([*lines, "checkpoint.prefetch", ""]))
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert borrowed(f, mods, own) == [
            "x.py:1 from growtool.io.checkpoint import atomic_file",
            "x.py:3 growtool.io.checkpoint.prefetch",
        ]
    finally:
        ROOT = root


# ---- the code map ------------------------------------------------------------------------------


def test_every_module_is_in_the_code_map():
    text = (ROOT / "docs" / "growth.md").read_text()
    section = text[text.index("## Where the code is") :].split("\n## ")[0]
    listed = set(re.findall(r"`(growtool/[\w/]+\.py)`", section))
    files = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent == PKG}
    assert not files - listed, f"modules missing from docs/growth.md's code map: {sorted(files - listed)}"
    assert not listed - files, f"the code map names modules that do not exist: {sorted(listed - files)}"


# ---- function size -------------------------------------------------------------------------------

MAX_FUNCTION_LINES, MAX_PARAMETERS = 60, 8
# "module:function" -> why it may be longer (lines) or take more parameters; the lead edits these
LONG_FUNCTIONS = {
    "growtool.nn.families:arch_specs": "the architecture table: one entry per family, data",
    "growtool.nn.config:from_hf": "HF config.json keys read one by one, one line each, per family",
}
MANY_PARAMETERS = {
    "growtool.training.settings:setting": "one declaration per setting: name, type, default, help, bounds, ...",
    "growtool.check:verify": "the library's verify: its documented keywords (docs/library.md)",
}


def functions():
    """(``module:function``, lines, parameters) of every function; click commands are left out
    (their parameters are the command's options)."""
    for n, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("command" in ast.unparse(d) for d in node.decorator_list):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs] + [x for x in (a.vararg, a.kwarg) if x]
            params = [x for x in params if x.arg not in ("self", "cls")]
            yield f"{n}:{node.name}", node.end_lineno - node.lineno + 1, len(params)


def test_functions_are_short_and_take_few_parameters():
    found = list(functions())
    long = {f: k for f, k, _ in found if k > MAX_FUNCTION_LINES and f not in LONG_FUNCTIONS}
    many = {f: k for f, _, k in found if k > MAX_PARAMETERS and f not in MANY_PARAMETERS}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them, or list them with a reason): {long}"
    assert not many, f"functions over {MAX_PARAMETERS} parameters (pass an object, or list them with a reason): {many}"
    names = {f for f, _, _ in found}
    stale = [f for f in {**LONG_FUNCTIONS, **MANY_PARAMETERS} if f not in names]
    assert not stale, f"exceptions listed for functions that no longer exist: {stale}"
    assert len(found) > 500 and any(k > MAX_FUNCTION_LINES for f, k, _ in found)  # the walk sees the code

"""The layers hold: no import cycle among the project's modules (imports inside functions and under
TYPE_CHECKING counted), the kinds import nothing of the engine, and no module grows past its size."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runner", "steps", "sandbox_standin")

# What steps/ may import of runner/: the modules that import nothing of the project (causes as data) and the
# helpers the whole project shares (runner/util/, which imports only itself).
STEPS_MAY_IMPORT = {"runner.causes"}
SHARED = "runner.util"

LIMIT = 500
# Run as scripts by an isolated interpreter (`python -I FILE`): the guardian and a detached job's supervisor. They
# outlive the engine and start before any of the project is importable, so they import the standard library only.
SCRIPTS = ("runner/util/sweep.py", "steps/_support/supervise.py")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, anywhere in its text."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        out.add(f"{base}.{alias.name}")
                    elif base in modules:
                        out.add(base)
        out.discard(name)
        edges[name] = out
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_projects_modules() -> None:
    modules = _modules()
    edges = _imports(modules)
    assert "runner.engine.walk" in edges["runner.engine.plan"]  # the reader sees real imports
    assert _cycles(edges) == []


def test_the_kinds_import_nothing_of_the_engine() -> None:
    edges = _imports(_modules())
    wrong = {
        name: sorted(
            m for m in deps if m.startswith("runner") and m not in STEPS_MAY_IMPORT and not m.startswith(SHARED)
        )
        for name, deps in edges.items()
        if name.startswith("steps")
    }
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_the_shared_helpers_import_only_each_other() -> None:
    edges = _imports(_modules())
    shared = {name: deps for name, deps in edges.items() if name.startswith(SHARED)}
    assert "runner.util.atomic" in shared and "runner.util.faults" in shared["runner.util.atomic"]
    wrong = {name: sorted(d for d in deps if not d.startswith(SHARED)) for name, deps in shared.items()}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_no_module_grows_past_its_size() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in _modules().values()
    }
    assert "runner/engine/walk.py" in sizes
    assert {path: size for path, size in sizes.items() if size > LIMIT} == {}


def _top_level_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." if node.level else (node.module or "").partition(".")[0])
    return found


def test_the_scripts_a_bare_interpreter_runs_import_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    assert "dataclasses" in _top_level_imports(ROOT / SCRIPTS[0])  # the reader sees them
    wrong = {script: sorted(_top_level_imports(ROOT / script) - allowed) for script in SCRIPTS}
    assert {script: names for script, names in wrong.items() if names} == {}

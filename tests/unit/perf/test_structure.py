"""perf/ stays proportionate and acyclic: no import cycle between its modules, imports at the top (a
function-local one only for an optional heavy dependency, saying so), and at most 0.6x engine_lib's lines."""
from __future__ import annotations

import ast
import os
from pathlib import Path

from testing import REPO

PERF = REPO / "perf"


def sources(folder) -> list:
    """The tracked Python files under `folder` (not perf/.peers: the peers' venvs)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in sorted(files) if f.endswith(".py")]
    return found


def module_name(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def perf_imports(path) -> set[str]:
    """The perf modules a module imports (relative or absolute; `from . import x` names module x if it is one)."""
    name, found = module_name(path), set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base == "perf" or base.startswith("perf."):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "perf"}
    modules = {module_name(p) for p in sources(PERF)}
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_in_perf():
    graph = {module_name(p): perf_imports(p) for p in sources(PERF)}
    done, active = set(), []

    def visit(node):
        if node in active:
            raise AssertionError("import cycle: " + " -> ".join(active[active.index(node):] + [node]))
        if node in done:
            return
        active.append(node)
        for child in sorted(graph.get(node, ())):
            if child != "perf":  # the package's own __init__ holds constants only
                visit(child)
        active.pop()
        done.add(node)

    for module in sorted(graph):
        visit(module)


def test_imports_are_at_the_top_unless_an_optional_heavy_dependency_says_so():
    local = []
    for path in sources(PERF):
        lines = path.read_text().splitlines()
        for func in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                    local.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not local, f"function-local imports without a comment saying why: {local}"


def python_lines(folder) -> int:
    return sum(len(p.read_text().splitlines()) for p in sources(folder))


def test_perf_is_at_most_six_tenths_of_the_engine():
    perf, engine = python_lines(PERF), python_lines(REPO / "engine_lib")
    assert perf <= 0.6 * engine, f"perf/ has {perf} lines of Python, engine_lib {engine}: keep perf under 0.6x"

"""gateway's imports run one way: api -> http -> engine -> the shared modules (config, errors,
metrics), with app, __main__ and workers above all; an API family never imports another; no
import cycle, function-local imports included; no module uses another object's private names."""
from __future__ import annotations

import ast

import pytest

from testing import REPO

GATEWAY = REPO / "gateway"
PACKAGES = {"api", "batch", "engine", "http"}
TOP = {"app", "__main__", "workers"}  # they wire the rest together
# layer -> the layers it may import (None: the shared top-level modules)
ALLOWED = {
    None: {None},
    "engine": {None, "engine"},
    "http": {None, "engine", "http"},
    "batch": {None, "batch"},  # the Batch API's store and runner: below the handlers, beside engine
    "api": {None, "engine", "http", "batch"},  # and no other family
    "top": {None, "engine", "http", "api", "batch", "top"},
}
# Private names of objects from outside gateway/ that a module reads, for want of a public view.
OUTSIDE_PRIVATE = {("gateway.engine.liveness", "_closing"), ("gateway.engine.liveness", "_workers")}  # rose_client


def module_name(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(GATEWAY.rglob("*.py"))}


def layer(name: str) -> str | None:
    part = name.split(".")[1] if "." in name else ""
    return part if part in PACKAGES else "top" if part in TOP else None


def imported_modules(name: str) -> set[str]:
    """The gateway modules `name` imports, anywhere in it (relative imports resolved)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_one_way(name):
    imported = imported_modules(name)
    wrong = sorted(m for m in imported if layer(m) not in ALLOWED[layer(name)])
    assert not wrong, f"{name} ({layer(name) or 'shared'}) imports {wrong}"
    if layer(name) == "api":
        families = sorted(m for m in imported if layer(m) == "api" and m != "gateway.api")
        assert not families, f"{name} imports another API family: {families}"


def test_no_import_cycle():
    graph = {name: imported_modules(name) for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name not in done:
            for imported in sorted(graph[name]):
                visit(imported, path + [name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_names_of_others(name):
    """Neither `from x import _name` nor `thing._name` on anything but self or cls."""
    wrong = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ImportFrom):
            wrong |= {a.name for a in node.names if a.name.startswith("_")}
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) and (name, node.attr) not in \
                    OUTSIDE_PRIVATE:
                wrong.add(node.attr)
    assert not wrong, f"{name} uses private names of other modules or objects: {sorted(wrong)}"

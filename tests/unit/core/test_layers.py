"""engine_lib's imports run one way: service -> runner -> models -> attention -> device,
with tokenization beside them; the modules the tokenizer models and the scheduler load
never import torch (each Triton stub would pay for it at start)."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from testing import REPO

# package -> the engine_lib packages it must not import (the shared top-level modules
# contract, config, options, model_folder, errors and faults are open to all).
FORBIDDEN = {
    "device": {"attention", "models", "runner", "service", "tokenization"},
    "attention": {"models", "runner", "service", "tokenization"},
    "models": {"runner", "service", "tokenization"},
    "runner": {"service", "tokenization"},
    "tokenization": {"attention", "device", "models", "runner", "service"},
    "service": {"tokenization"},
    None: {"attention", "device", "models", "runner", "service", "tokenization"},  # top-level modules
}
TORCH_FREE = ["engine_lib.contract", "engine_lib.config", "engine_lib.options", "engine_lib.model_folder",
              "engine_lib.service.scheduler", "engine_lib.service.batching", "engine_lib.service.endpoint",
              "engine_lib.tokenization.steps", "rose_triton.parameters"]


def imported_packages(path):
    """engine_lib subpackages a module imports (absolute imports only: the tree uses no relative ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "engine_lib" and len(parts) > 1:
                found.add(parts[1])
    return found


def modules() -> list:
    params = []
    for path in sorted((REPO / "engine_lib").rglob("*.py")):
        parts = path.relative_to(REPO / "engine_lib").parts
        params.append(pytest.param(path, parts[0] if len(parts) > 1 else None, id=str(path.relative_to(REPO))))
    return params


@pytest.mark.parametrize("path, package", modules())
def test_imports_run_one_way(path, package):
    wrong = imported_packages(path) & FORBIDDEN[package]
    assert not wrong, f"{path.relative_to(REPO)} ({package or 'top level'}) imports {sorted(wrong)}"


def test_scheduler_service_and_tokenizer_modules_never_import_torch():
    code = ("import importlib, sys\n"
            f"for name in {TORCH_FREE!r}:\n"
            "    importlib.import_module(name)\n"
            "    assert 'torch' not in sys.modules, name\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]

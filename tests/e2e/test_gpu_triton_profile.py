"""perf's `gpu-triton` profile (the GPU machine's check of the model repository under tritonserver) in its
CPU dry run: it serves a random-weight Qwen3 embedder, checks its rows against transformers, reads the
encoder's device off /metrics and times the ensemble."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine_lib.runner.self_check import MIN_COSINE
from testing import REPO


@pytest.mark.own_server
def test_gpu_triton_dry_run_serves_checks_and_times_the_ensemble(tmp_path):
    run = subprocess.run([sys.executable, "-m", "perf", "run", "--profile", "gpu-triton", "--dry-run", "--quiet-wait",
                          "0", "--out", str(tmp_path)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "gpu-triton.json").read_text())
    assert results["ok"] and results["dry_run"] and results["device"] == "cpu"
    assert results["min_cosine"] >= MIN_COSINE
    batch1, clients = (cell["results"]["rose"] for cell in results["cells"])
    assert batch1["n"] == 20 and clients["embeddings"] > 0
    assert "# Benchmark `gpu-triton-dry-run`" in (tmp_path / "gpu-triton.md").read_text()

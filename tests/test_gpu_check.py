"""perf/gpu_check.sh --dry-run: the GPU session's script runs its CPU-side logic end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path):
    run = subprocess.run([str(REPO / "perf" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "latency.json").read_text())
    assert report["dry_run"] and report["all_cosines_ok"]
    assert set(report["results"]) == {"rose_eager", "rose_graphs", "hf_transformers"}
    for system in report["results"].values():
        assert set(system) == {"8", "40"} and all(r["n"] == 1 and r["p99_ms"] > 0 for r in system.values())
    stats = report["graph_stats"]
    assert stats["eager_runs"] == 1 and stats["captures"] == 1 and stats["replays"] > 0  # one (1, 64) graph

"""perf/gpu_check.sh --dry-run: the GPU session's script runs the harness's GPU profiles end to end on CPU."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from engine_lib.runner.self_check import MIN_COSINE
from testing import REPO


def test_gpu_check_dry_run_writes_harness_json_to_a_temporary_folder():
    results_before = sorted(p.name for p in (REPO / "perf" / "results").iterdir())
    run = subprocess.run([str(REPO / "perf" / "gpu_check.sh"), "--dry-run"],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = Path(re.search(r"\[gpu_check\] results in (\S+)", run.stderr).group(1))
    try:
        assert REPO / "perf" / "results" not in out.parents
        assert sorted(p.name for p in (REPO / "perf" / "results").iterdir()) == results_before

        served = json.loads((out / "gpu-served.json").read_text())
        assert served["ok"] and served["dry_run"] and served["concurrency"]["errors"] == []
        assert served["concurrency"]["min_cosine_vs_fp32"] >= MIN_COSINE and served["concurrency"]["requests"] > 1
        assert {c["scenario"][0] for c in served["cells"]} == {"1", "2", "3"}
        assert all(c["results"]["rose"]["n"] > 0 for c in served["cells"])
        stats = served["graph_stats"]
        assert stats["replays"] > 0 and stats["capture_failures"] == 0
        assert "# Benchmark `gpu-served-dry-run`" in (out / "gpu-served.md").read_text()  # the harness renders it

        latency = json.loads((out / "gpu-latency.json").read_text())
        assert latency["ok"] and latency["dry_run"] and latency["graph_stats"]["replays"] > 0
        assert [c["seq_len"] for c in latency["cells"]] == [8, 40]
        for cell in latency["cells"]:
            assert set(cell["results"]) == {"rose", "rose-eager", "hf-transformers"}
            assert all(r["n"] == 1 and r["min_cosine"] >= MIN_COSINE for r in cell["results"].values())
        assert "ours vs hf-transformers" in (out / "gpu-latency.md").read_text()
    finally:
        shutil.rmtree(out, ignore_errors=True)

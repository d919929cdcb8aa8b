"""perf/gpu_check.sh --dry-run: the GPU session's script runs the harness's GPU profile end to end on CPU."""
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
        assert served["ok"] and served["dry_run"] and served["self_check_cosine"] >= MIN_COSINE
        assert {c["scenario"][0] for c in served["cells"]} == {"1", "2", "3"}
        assert all(c["results"][target]["n"] > 0 for c in served["cells"] for target in ("rose", "hf"))
        check = served["output_check"]
        assert check["ok"] and min(check["served_min_cosine"]) >= MIN_COSINE and len(check["served_min_cosine"]) == 3
        budget = json.loads((out / "gpu-budget.json").read_text())
        assert budget["ok"] and budget["dry_run"] and set(budget["settings"]) == {"rose", "budget-64", "one-in-flight"}
        assert budget["settings"]["budget-64"].startswith("max_batch_tokens 64,")
        assert budget["settings"]["one-in-flight"].endswith(", 1 in flight")
        for cell in budget["cells"]:
            assert all(r["n"] > 0 for r in cell["results"].values()), cell["key"]
        stats = served["graph_stats"]
        assert stats["replays"] > 0 and stats["capture_failures"] == 0
        assert "# Benchmark `gpu-served-dry-run`" in (out / "gpu-served.md").read_text()  # the harness renders it
    finally:
        shutil.rmtree(out, ignore_errors=True)

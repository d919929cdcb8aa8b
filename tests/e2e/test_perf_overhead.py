"""The overhead profile (perf/overhead.py): its /proc accounting, and a short form against a real server.

Structure, not speed: every path measured, checked against sentence-transformers,
overheads and server CPU by process present, the report renders."""
import json
import os
import time

import pytest

from engine_lib.runner.self_check import MIN_COSINE
from perf import machine, procstat
from perf.overhead import Settings, markdown, run

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests


def test_process_tree_cpu_counts_children(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(600)"])
    try:
        deadline = time.monotonic() + 120
        while procstat.tree_cpu_seconds(os.getpid()).get("python", 0) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procstat.find_named(os.getpid(), "python") is not None
        by_name = procstat.tree_cpu_seconds(os.getpid())
        assert sum(by_name.values()) >= 0.25
        assert procstat.diff(by_name, {}) == by_name
    finally:
        child.kill()
        child.wait()


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """The profile's short form: every path, a few requests each, one small load cell pair."""
    settings = Settings(rounds=1, per_round=6, load_seconds=1.0, load_rounds=1, concurrencies=(1, 2),
                        load_paths=("tokens",))
    out = tmp_path_factory.mktemp("overhead") / "overhead.json"
    desc = machine.describe()
    return run(None, [], settings, out, desc), out


def test_short_form_measures_every_path(short_run):
    results, out = short_run
    assert json.loads(out.read_text())["paths"].keys() == results["paths"].keys()
    assert set(results["paths"]) == set(Settings().paths)
    for path, by_variant in results["paths"].items():
        r = by_variant["current"]
        assert r["n"] == 6 and r["p99_ms"] >= r["p50_ms"] > 0, path
        assert r["overhead_p50_ms"] == pytest.approx(r["p50_ms"] - r["model_ms"])
        assert r["server_cpu_ms_per_request"] >= 0 and r["client_cpu_ms_per_request"] > 0
        if not path.startswith("floor_"):
            assert r["min_cosine"] >= MIN_COSINE and r["model_ms"] > 0, path
    inproc = results["inproc"]
    assert all(inproc[k]["n"] == 6 for k in ("engine_step", "tokenizer"))


def test_short_form_counts_server_cpu_by_process_and_load(short_run):
    results, _ = short_run
    tokens = results["paths"]["tokens"]["current"]
    # /proc counts 10 ms ticks: over 6 requests a process may show none, so check the accounting, not amounts
    by_process = tokens["server_cpu_ms_by_process"]
    assert all(name == "tritonserver" or name.startswith("stub:") for name in by_process), by_process
    assert sum(by_process.values()) == pytest.approx(tokens["server_cpu_ms_per_request"])
    cells = results["load"]
    assert [(c["path"], c["concurrency"]) for c in cells] == [("tokens", 1), ("tokens", 2)]
    assert all(c["results"]["current"]["requests_per_s"] > 0 for c in cells)


def test_short_form_report_names_every_path(short_run):
    results, out = short_run
    text = markdown(results)
    for path in results["paths"]:
        assert f"`{path}`" in text
    assert "overhead p50" in text and "Concurrent clients" in text

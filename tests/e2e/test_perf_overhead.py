"""The overhead profile (perf/overhead/): its pieces, and a short form against a real server.

Structure, not speed: every path measured, checked against sentence-transformers,
overheads, server CPU and per-hop statistics present, the report renders."""
import json
import os
import time

import pytest

from engine_lib.runner.self_check import MIN_COSINE
from perf import machine, report
from perf.overhead import hops, procstat
from perf.overhead.run import Settings, run

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


def test_hop_means_are_weighted_by_requests_over_windows():
    windows = [({"ok": 14.0, "wait": 1.002}, {"ok": 10.0, "wait": 1.0}),    # 4 requests, 2 ms
               ({"ok": 15.0, "wait": 1.003}, {"ok": 14.0, "wait": 1.002})]  # 1 request, 1 ms
    total: dict = {}
    for after, before in windows:
        hops.add(total, hops.hops_delta(after, before))
    assert hops.hops_means(total) == pytest.approx({"wait": 3e-3 / 5 * 1e6})
    assert hops.hops_means({}) == {}
    zero = {"success": (0, 0), "queue": (0, 0), "executions": (0, 0)}
    stats = [{"m": {"success": (5, 0), "queue": (5, 5000), "executions": (5, 0)}, "idle": zero},
             {"m": {"success": (9, 0), "queue": (9, 13000), "executions": (7, 0)}, "idle": zero},
             {"m": {"success": (10, 0), "queue": (10, 23000), "executions": (8, 0)}, "idle": zero}]
    total = {}
    for before, after in zip(stats, stats[1:]):
        hops.add(total, hops.triton_delta(after, before))
    assert set(total) == {"m"}
    assert hops.triton_means(total) == {"m": {"requests": 5, "executions": 3, "queue_us": 18.0 / 5,
                                              "success_us": 0.0}}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """The profile's short form: every path, a few requests each, one small load cell pair."""
    settings = Settings(rounds=1, per_round=6, load_seconds=1.0, load_rounds=1, concurrencies=(1, 2),
                        load_paths=("tokens",), metrics_lag_s=0.6)
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
    assert all(inproc[k]["n"] == 6 for k in ("engine_step", "tokenizer", "service"))


def test_short_form_breaks_down_hops_and_load(short_run):
    results, _ = short_run
    ensemble = results["paths"]["ensemble"]["current"]["triton_stats"]
    assert {"ensemble", "tokenizer", "rose_encoder"} <= set(ensemble)
    assert ensemble["rose_encoder"]["requests"] == 6 and "queue_us" in ensemble["rose_encoder"]
    unary = results["paths"]["unary_grpc"]["current"]["triton_stats"]
    assert {"embed", "rose_encoder"} <= set(unary) and not {"ensemble", "tokenizer"} & set(unary)  # tokenizes itself
    assert unary["rose_encoder"]["requests"] == 6
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
    text = report.markdown(results)
    for path in results["paths"]:
        assert f"`{path}`" in text
    assert "overhead p50" in text and "Where the time goes" in text
    readme = report.readme_section([out], out.parent)
    assert all(f"`{path}`" in readme for path in results["paths"])

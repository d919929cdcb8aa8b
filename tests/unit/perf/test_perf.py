"""perf harness pieces without a server: inputs, statistics, skips, ratios, reports."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from perf import mix, report
from perf.measure import combine, latency_stats, min_cosine, threaded_loop
from perf.profiles import PROFILES, Cell, select
from perf.runner import run_rounds, server_env, skip_reason
from perf.texts import TextMaker


@pytest.fixture(scope="module")
def maker(model_dir):
    return TextMaker(os.path.join(model_dir, "tokenizer.json"), 512)


@pytest.mark.parametrize("length", [8, 32, 128, 256])
def test_texts_tokenize_to_exact_length(maker, length):
    requests = maker.requests(3, 4, length)
    assert all((r.seq_lens == length).all() for r in requests)
    assert all(maker.count(t) == length for r in requests for t in r.texts)
    assert requests[0].input_ids.size == requests[0].num_tokens == 4 * length


def test_texts_are_deterministic_and_mixed_stays_in_range(maker):
    a, b = maker.requests(2, 16, "mixed", 256), maker.requests(2, 16, "mixed", 256)
    assert [r.texts for r in a] == [r.texts for r in b]
    lens = np.concatenate([r.seq_lens for r in a])
    assert lens.min() >= 8 and lens.max() <= 256 and len(set(lens.tolist())) > 8


def test_latency_stats_and_combine():
    stats = latency_stats(list(range(1, 101)))
    assert stats["n"] == 100 and stats["max_ms"] == 100 and 50 <= stats["p50_ms"] <= 51
    parts = [{"rows": 10, "requests": 5, "start": 0.0, "end": 2.0, "latencies_ms": [1.0] * 5},
             {"rows": 30, "requests": 5, "start": 0.1, "end": 4.0, "latencies_ms": [3.0] * 5}]
    assert combine(parts)["embeddings_per_s"] == pytest.approx(10.0)


def test_a_client_that_fails_fails_the_threaded_loop():
    def call(request):
        raise MemoryError("out of device memory")

    with pytest.raises(MemoryError, match="out of device memory"):
        threaded_loop(call, [object()], concurrency=2, duration=60.0)


def test_profiles_cover_the_seeds_four_scenarios():
    for name in ("seed", "cpu"):
        assert len({c.scenario for c in PROFILES[name].cells}) == 4, name
    seed = {c.key: c for c in PROFILES["seed"].cells}
    assert seed["s1-len4096"].seq_len == 4096 and seed["s3-len512"].batch == 100
    assert [c.concurrency for c in PROFILES["seed"].cells if c.scenario.startswith("4")] == [1, 2, 4, 8, 16]
    assert all(c.seq_len == "mixed" or c.seq_len <= 256 for c in PROFILES["cpu"].cells)


def test_select_takes_the_named_cells_scaled():
    cells = select(PROFILES["cpu"].cells, "s1-len32,s3-len128", 0.5)
    assert [c.key for c in cells] == ["s1-len32", "s3-len128"]
    assert cells[0].num_requests == 100 and cells[1].duration_s == 10.0
    assert select(PROFILES["cpu"].cells, None, 1.0) == list(PROFILES["cpu"].cells)
    entry = cells[0].entry({"rose": {"n": 1}})
    assert entry["key"] == "s1-len32" and entry["label"] == cells[0].label and entry["results"] == {"rose": {"n": 1}}


class _Target:
    def __init__(self, in_process, tokens=True):
        self.in_process, self.tokens = in_process, tokens

    def input_used(self, cell):
        return "tokens" if cell.input == "tokens" and self.tokens else "text"


def test_cells_past_the_model_are_skipped_not_truncated():
    long = Cell("1", "k", "sequential", "tokens", 4096, 1)
    assert "maximum" in skip_reason(long, _Target(False), 512, 256)
    mid = Cell("1", "k", "sequential", "tokens", 512, 1)
    assert skip_reason(mid, _Target(False), 512, 256) is None        # ids straight to the encoder
    assert "maximum" in skip_reason(mid, _Target(False, tokens=False), 512, 256)  # text-only peers truncate
    served = Cell("4", "k", "load", "text", 128, 1, 4, served_only=True)
    assert "in-process" in skip_reason(served, _Target(True), 512, 256)


def test_min_cosine():
    rng = np.random.default_rng(0)
    want = rng.normal(size=(4, 8))
    assert min_cosine(want * 3, want) == pytest.approx(1.0)
    assert min_cosine(-want, want) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        min_cosine(want[:3], want)


def _results():
    cells = []
    for key, mode, metric, ours, peer in (("a", "sequential", "p50_ms", 10.0, 30.0),
                                          ("b", "load", "embeddings_per_s", 200.0, 100.0)):
        res = {m: v for m, v in (("p50_ms", 10.0), ("p90_ms", 11.0), ("p99_ms", 12.0), ("max_ms", 13.0),
                                 ("embeddings_per_s", 5.0), ("mean_tokens_per_text", 128.0))}
        cells.append({"scenario": "s", "key": key, "label": key, "mode": mode, "metric": metric, "concurrency": 1,
                      "results": {"rose": {**res, metric: ours}, "st": {**res, metric: peer},
                                  "bad": {"error": "warm-up check failed: min cosine 0.5"}}})
    machine = {"date": "2000-01-01", "cpu": "CPU", "cores": 2, "cpu_isa": ["avx2"], "gpu": None, "memory_gib": 1,
               "os": "os", "python": "3", "packages": {}, "load_avg_at_start": [0, 0, 0], "git_commit": "x"}
    return {"profile": "t", "description": "d", "notes": [], "machine": machine,
            "model": {"name": "m", "config": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6}},
            "gemm": {"flops_per_s": 1e11, "dtype": "float32", "n": 1024}, "targets": {"rose": {}, "st": {}, "bad": {}},
            "cells": cells}


def test_ratios_say_ours_is_better_above_one():
    results = _results()
    assert report.speedup(results["cells"][0], *(results["cells"][0]["results"][n] for n in ("rose", "st"))) == 3.0
    assert report.speedup(results["cells"][1], *(results["cells"][1]["results"][n] for n in ("rose", "st"))) == 2.0
    text = report.markdown(results)
    assert "3.00x" in text and "2.00x" in text and "**failed**" in text and "min cosine 0.5" in text


def test_our_in_process_engine_is_compared_with_the_in_process_peers():
    results = _results()
    for cell in results["cells"]:
        cell["results"]["rose-inproc"] = {**cell["results"]["rose"], cell["metric"]: cell["results"]["rose"][cell["metric"]] * 2}
    results["targets"]["rose-inproc"] = {}
    text = report.markdown(results)
    assert "| ours vs st | ours vs bad | ours vs rose-inproc | ours in-process vs st |" in text
    assert "| 3.00x | - | 2.00x | 1.50x |" in text  # p50 ms: st 30, ours 10, ours in-process 20


class TurnTaker:
    """A target answering its warm-up with `rows` and each timed request in `ms`; logs whose turn it was."""
    in_process, versions = True, {}

    def __init__(self, name, rows, ms, turns):
        self.name, self.rows, self.ms, self.turns = name, rows, ms, turns

    def input_used(self, cell):
        return "text"

    def embed(self, cell, requests):
        return [self.rows for _ in requests]

    def sequential(self, cell, requests, label):
        self.turns.append((self.name, cell.num_requests))
        return [self.ms] * cell.num_requests


def test_rounds_give_the_targets_turns_and_pool_their_latencies():
    cell = Cell("1", "seq", "sequential", "text", 32, 1, num_requests=7, max_seconds=30)
    rows, turns = np.eye(2, 4, dtype=np.float32), []
    targets = {"a": TurnTaker("a", rows, 2.0, turns), "b": TurnTaker("b", rows, 4.0, turns),
               "wrong": TurnTaker("wrong", rows[::-1], 1.0, turns)}
    requests = [SimpleNamespace(num_tokens=32, seq_lens=[32])] * 2
    out = run_rounds(cell, targets, requests, [rows, rows], 2, rounds=3, quiet=(1.0, 0))
    assert turns == [("a", 3), ("b", 3)] * 3  # ceil(7 / 3) requests a round, in turns; never the wrong one
    assert out["a"]["n"] == out["b"]["n"] == 9 and out["a"]["rounds"] == 3
    assert (out["a"]["p50_ms"], out["b"]["p50_ms"]) == (2.0, 4.0) and out["a"]["min_cosine"] == pytest.approx(1.0)
    assert "warm-up check failed" in out["wrong"]["error"] and "p50_ms" not in out["wrong"]


def test_readme_table_has_a_row_per_cell_and_a_column_per_target(tmp_path):
    folder = tmp_path / "perf" / "results" / "cpu-2c"
    folder.mkdir(parents=True)
    (folder / "cpu.json").write_text(json.dumps({**_results(), "profile": "cpu"}))
    table = report.readme_table(tmp_path / "perf" / "results", tmp_path)
    assert "[cpu.md](perf/results/cpu-2c/cpu.md)" in table and "| cell | metric | rose | st | bad |" in table
    assert "| a | p50 ms | 10.0 | 30.0 (3.00x) | - |" in table and "| b | emb/s | 200.0 | 100.0 (2.00x) | - |" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\n{report.README_BEGIN}\nold\n{report.README_END}\nend\n")
    report.write_readme_table(readme, table)
    assert readme.read_text() == f"# T\n\n{report.README_BEGIN}\n{table}{report.README_END}\nend\n"


def test_readme_table_shows_each_profile_once_from_the_machine_that_ran_it_last(tmp_path):
    results = tmp_path / "perf" / "results"
    for machine, date in (("old-2c", "2026-11-30"), ("new-2c", "2026-12-03")):
        (results / machine).mkdir(parents=True)
        body = _results()
        isa = ["avx2", "avx512f"] if machine == "new-2c" else ["avx2"]
        (results / machine / "cpu.json").write_text(json.dumps({**body, "profile": "cpu", "machine": {
            **body["machine"], "date": date, "cpu_isa": isa}}))
    (results / "old-2c" / "gateway.json").write_text(json.dumps({**_results(), "profile": "gateway"}))
    table = report.readme_table(results, tmp_path)
    assert "perf/results/new-2c/cpu.md" in table and "perf/results/old-2c/cpu.md" not in table
    assert "**`cpu`** on CPU (2 cores, AVX-512, no GPU)" in table  # hosts of one name differ by ISA
    assert "**`gateway`** on CPU (2 cores, AVX2, no GPU)" in table
    assert "perf/results/old-2c/gateway.md" in table  # a profile only one machine ran stays
    assert table.index("**`gateway`**") < table.index("**`cpu`**")  # the profiles' order, not the machines'


def test_mix_summary_checks_its_targets_and_the_report_renders():
    def phase(p50, p99, emb):
        return {"interactive": {"p50_ms": p50, "p99_ms": p99, "n": 10}, "bulk": {"embeddings_per_s": emb}}

    idle = {"p50_ms": 50.0, "p99_ms": 100.0, "n": 40}
    on, off = phase(900.0, 2000.0, 95.0), phase(15000.0, 30000.0, 100.0)
    summary = mix.summarize(idle, 1.0, on, off)  # bound: 100 ms + 2 x 1 s
    assert summary["p99_bound_ms"] == 2100.0 and summary["p99_off_over_on"] == 15.0
    assert all(summary["targets"].values())
    assert not any(mix.summarize(idle, 0.5, on, phase(1e3, 4e3, 200.0))["targets"].values())
    machine = {"date": "2026-12-01", "cpu": "cpu", "cores": 2, "cpu_isa": [], "memory_gib": 1, "os": "os",
               "python": "3", "load_avg_at_start": [1.0], "git_commit": "abc"}
    rounds = [{"round": 0, "phase": name, "server": {"steps": 3, "mean_step_s": 1.0, "mean_step_tokens": 2048,
                                                      "promoted_sequences": 0},
               "interactive": {**p["interactive"], "requests": 10}, "bulk": p["bulk"]}
              for name, p in (("on", on), ("off", off))]
    results = {"profile": "mix", "machine": machine, "model": {"name": "m"}, "description": "d",
               "settings": {**mix.SIZES, "max_batch_tokens": 2048, "server_env": {}, "full_batch": "8 x 256"},
               "check": {"min_cosine_vs_sentence_transformers": 1.0}, "idle": idle, "batch_times_s": [1.0],
               "rounds": rounds, "phases": {"on": on, "off": off}, "summary": summary}
    text = mix.markdown(results)
    assert "| priority on | 900 | 2000 | 10 | 95.0 |" in text and "p99 off / on = 15.0x" in text


def test_machine_description_without_git_takes_the_commit_from_the_environment(monkeypatch):
    from perf import machine

    monkeypatch.setenv("PATH", "/nonexistent")  # no git to run, as on the device machine
    monkeypatch.setenv("GIT_COMMIT", "abc1234")
    assert machine.describe()["git_commit"] == "abc1234"


def test_results_folder_tells_hosts_of_one_name_apart_by_avx512():
    from perf import machine

    epyc = {"cpu": "AMD EPYC", "cores": 2, "gpu": None}
    assert machine.slug({**epyc, "cpu_isa": ["avx2"]}) == "amd-epyc-2c"
    assert machine.slug({**epyc, "cpu_isa": ["avx2", "avx512f", "avx512_bf16"]}) == "amd-epyc-avx512-2c"
    assert machine.slug({"cpu": "Intel(R) Xeon(R) Processor", "cores": 16, "cpu_isa": ["avx512f"],
                         "gpu": "NVIDIA H200, 143771 MiB"}) == "nvidia-h200-16c"


def test_server_env_takes_key_value_pairs_and_refuses_others():
    import argparse

    assert server_env(argparse.Namespace(server_env=None)) == {}
    parsed = server_env(argparse.Namespace(server_env=["ROSE_DTYPE=bfloat16", "ROSE_QUERY_PREFIX=q: a=b"]))
    assert parsed == {"ROSE_DTYPE": "bfloat16", "ROSE_QUERY_PREFIX": "q: a=b"}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        server_env(argparse.Namespace(server_env=["ROSE_DTYPE"]))


def test_model_dir_is_made_absolute_only_for_an_existing_folder(tmp_path, monkeypatch):
    from perf.__main__ import model_dir_arg

    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    assert model_dir_arg("folder") == str(tmp_path / "folder")  # --compare servers start elsewhere
    assert model_dir_arg("default") == "default"  # a model name, not a path


class _Rows:
    """A target answering `rows_per_text` zero rows for each text it gets."""
    checks_rows = False

    def __init__(self, rows_per_text):
        self.rows_per_text = rows_per_text

    def embed(self, cell, requests):
        return [np.zeros((self.rows_per_text * len(r.texts), 4), dtype=np.float32) for r in requests]


def test_a_floor_target_is_served_from_the_floor_repository_and_only_its_row_counts_are_checked(monkeypatch):
    import argparse
    from pathlib import Path

    from perf import runner

    started = {}

    class Server:  # records how the run would start tritonserver
        grpc_url, gateway_url = "127.0.0.1:1", None

        def __init__(self, log_path, env, extra_args, ready_timeout, gateway):
            started["extra_args"] = extra_args

        def stop(self):
            pass

    monkeypatch.setattr(runner, "TritonServer", Server)
    args = argparse.Namespace(grpc_url=None, gateway_url=None, model_dir=None, server_env=None)
    targets = runner.start_targets(["rose-floor"], args, {"dir": "m", "config": {"hidden_size": 64}}, [])
    flag, repository = started["extra_args"][-2:]
    assert flag == "--model-repository" and (Path(repository) / "floor_ensemble" / "config.pbtxt").is_file()
    floor = targets["rose-floor"]
    assert floor.text_spec.model == "floor_ensemble" and not floor.checks_rows

    cell = Cell("1", "seq", "sequential", "text", 32, 2, num_requests=2, max_seconds=1)
    requests = [SimpleNamespace(texts=["a", "b"])] * 2
    reference = [np.ones((2, 4), dtype=np.float32)] * 2
    assert runner.check_target(cell, _Rows(1), requests, reference, 2) == {"min_cosine": None}
    assert "rows per response" in runner.check_target(cell, _Rows(2), requests, reference, 2)["error"]


def test_a_floor_is_in_the_report_and_not_in_the_readme_table(tmp_path):
    results = _results()
    results["targets"]["rose-floor"] = {}
    for cell in results["cells"]:
        cell["results"]["rose-floor"] = {**cell["results"]["st"], "min_cosine": None}
    assert "`rose-floor` answers zeros" in report.markdown(results)
    folder = tmp_path / "perf" / "results" / "cpu-2c"
    folder.mkdir(parents=True)
    (folder / "cpu.json").write_text(json.dumps({**results, "profile": "cpu"}))
    assert "| cell | metric | rose | st | bad |" in report.readme_table(tmp_path / "perf" / "results", tmp_path)

"""perf harness pieces without a server: inputs, statistics, skips, ratios, reports."""
import json
import os

import numpy as np
import pytest

from perf import report
from perf.machine import flops_per_token
from perf.measure import combine, latency_stats
from perf.profiles import PROFILES, Cell, select
from perf.runner import min_cosine, skip_reason
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


def test_profiles_cover_the_seeds_four_scenarios():
    for name in ("seed", "cpu"):
        scenarios = {c.scenario for c in PROFILES[name].cells}
        assert len(scenarios) == 5, name  # the four, and scoring (2) again on a reranker (2r)
        rerank = [c for c in PROFILES[name].cells if c.task == "score"]
        assert [c.batch for c in rerank] == [5, 25, 50] and all(c.input == "tokens" for c in rerank), name
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


def test_flops_per_token_bert_and_qwen3_shapes():
    bert = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12}
    dense, attention = 2 * (4 * 384 * 384 + 2 * 384 * 1536), 2 * 2 * 384 * 128
    assert flops_per_token(bert, 128) == 6 * (dense + attention)
    qwen3 = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 1, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "model_type": "qwen3"}
    dense = 2 * (1024 * (16 + 2 * 8) * 128 + 16 * 128 * 1024 + 3 * 1024 * 3072)  # GQA projections, gated MLP
    assert flops_per_token(qwen3, 256) == dense + 2 * 2 * 16 * 128 * 256 * 0.5  # causal: half the scores


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


def test_readme_section_is_replaced_in_place(tmp_path):
    results_file = tmp_path / "perf" / "t.json"
    results_file.parent.mkdir()
    results_file.write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\ntext\n")
    for _ in range(2):
        report.update_readme(readme, report.readme_section([results_file], tmp_path))
    text = readme.read_text()
    assert text.count("## Performance") == 1 and text.count(report.README_BEGIN) == 1 and "3.00x" in text


@pytest.fixture(scope="module")
def tiny_cross_encoder(model_dir, tmp_path_factory):
    """A random-weight BERT cross-encoder, tiny, with the embedded model's real tokenizer (perf text windows)."""
    import shutil

    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-ce")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if os.path.isfile(os.path.join(model_dir, name)):
            shutil.copy(os.path.join(model_dir, name), folder / name)
    return str(folder)


def test_scoring_requests_are_exact_pairs_checked_against_cross_encoder(tiny_cross_encoder):
    from engine_lib.contract import PackedBatch
    from engine_lib.options import RerankOptions
    from engine_lib.runner.model_runner import ModelRunner
    from engine_lib.service.outputs import ScoreOutput
    from perf.scoring import PairRequests, ScoreReference, check_scores

    requests = PairRequests(tiny_cross_encoder).requests(2, 5, 64)
    assert all((r.seq_lens == 64).all() and len(r.texts) == 5 for r in requests)
    assert all(set(r.token_types.tolist()) == {0, 1} and r.token_types.size == r.input_ids.size for r in requests)
    engine = ModelRunner(tiny_cross_encoder, device="cpu", task="score")
    ours = []
    for r in requests:
        bounds = np.concatenate([[0], np.cumsum(r.seq_lens)])
        split = lambda flat: [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        rows = engine.step(PackedBatch.from_sequences(split(r.input_ids), split(r.token_types))).wait()
        ours.append(ScoreOutput(engine.score_activation).finish(rows, RerankOptions()))
    reference = ScoreReference(tiny_cross_encoder)
    want = [reference.scores(r) for r in requests]
    assert check_scores(ours, want) < 1e-3
    assert check_scores([o + 0.01 for o in ours], want) > 1e-3


def test_score_cells_without_a_reranker_are_skipped(model_dir, tmp_path):
    from perf.profiles import Profile
    from perf.runner import run_profile

    cell = [c for c in PROFILES["cpu"].cells if c.task == "score"][0]
    model = {"dir": model_dir, "name": "default", "max_positions": 512, "config": {}}
    target = type("Target", (), {"versions": {}})()
    results = run_profile(Profile("t", "t", (cell,), ("rose",)), [cell], {"rose": target}, model, {},
                          tmp_path / "r.json", {}, quiet=(1.0, 0))
    assert results["cells"][0]["results"] == {"rose": {"skipped": "no reranker (--rerank-model-dir)"}}


def test_mix_summary_checks_the_issue_targets_and_the_report_renders():
    from perf import mix

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
    text = report.markdown(results)
    assert "| priority on | 900 | 2000 | 10 | 95.0 |" in text and "p99 off / on = 15.0x" in text


def test_machine_description_without_git_takes_the_commit_from_the_environment(monkeypatch):
    from perf import machine

    monkeypatch.setenv("PATH", "/nonexistent")  # no git to run, as on the device machine
    monkeypatch.setenv("GIT_COMMIT", "abc1234")
    assert machine.describe()["git_commit"] == "abc1234"

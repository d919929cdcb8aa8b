"""The perf harness against the real server: timing only after a passing warm-up check."""
import numpy as np

from engine_lib.runner.self_check import MIN_COSINE
from perf.targets import gateway_target, rose_target
from perf.profiles import Cell, Profile
from perf.runner import run_profile

CELLS = (Cell("1", "seq", "sequential", "tokens", 32, 1, num_requests=6, max_seconds=20),
         Cell("3", "load", "load", "text", "mixed", 4, 2, duration_s=1, metric="embeddings_per_s"))


class WrongNumbers:
    """A peer that answers fast with the wrong embeddings: must get no timing."""
    in_process, versions = True, {}

    def input_used(self, cell):
        return "text"

    def embed(self, cell, requests):
        return [np.random.default_rng(0).normal(size=(len(r.texts), 384)) for r in requests]

    def sequential(self, cell, requests, label):
        raise AssertionError("timed a target that failed its check")

    load = sequential


def test_profile_runs_against_the_server_and_refuses_wrong_numbers(server, model_dir, tmp_path):
    profile = Profile("test", "e2e", CELLS, ("rose",), warmup_requests=2, pool_requests=4)
    model = {"dir": model_dir, "name": "default", "max_positions": 512, "config": {}}
    targets = {"rose": rose_target(server.grpc_url), "gateway": gateway_target(server.gateway_url),
               "wrong": WrongNumbers()}
    results = run_profile(profile, list(CELLS), targets, model, {}, tmp_path / "r.json", {}, quiet=(1.0, 0))
    seq, load = (c["results"] for c in results["cells"])
    assert seq["rose"]["n"] == 6 and seq["rose"]["min_cosine"] >= MIN_COSINE and seq["rose"]["input_used"] == "tokens"
    assert load["rose"]["embeddings_per_s"] > 0 and load["rose"]["min_cosine"] >= MIN_COSINE
    assert seq["gateway"]["n"] == 6 and seq["gateway"]["min_cosine"] >= MIN_COSINE  # through /v1/embeddings
    assert seq["gateway"]["input_used"] == "tokens" and load["gateway"]["min_cosine"] >= MIN_COSINE
    for res in (seq["wrong"], load["wrong"]):
        assert "warm-up check failed" in res["error"] and "p50_ms" not in res

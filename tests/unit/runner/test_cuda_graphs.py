"""Graph bookkeeping on CPU (buckets, lazy capture, counters) with an injected capture."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_lib.contract import PackedBatch
from engine_lib.runner.cuda_graphs import (
    CAPTURE,
    EAGER,
    REPLAY,
    GraphBuckets,
    LazyGraphCache,
    seq_buckets,
    token_buckets,
)
from engine_lib.runner.model_runner import ModelRunner
from testing.fake_engine import FakeCapture
from testing.tiny_models import qwen3_config, random_sequences, save_random_model, write_pooling


def test_token_buckets_are_64_then_256():
    buckets = token_buckets(4096)
    assert buckets[:3] == [64, 128, 192] and buckets[15:18] == [1024, 1280, 1536] and buckets[-1] == 4096
    assert len(buckets) == 16 + 12
    assert token_buckets(4160)[-2:] == [3840 + 256, 4160]
    assert seq_buckets(64) == [1, 2, 4, 8, 16, 32, 64] and seq_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_bucket_map_is_the_smallest_bucket_that_fits():
    buckets = GraphBuckets(max_tokens=4096, max_seqs=64)
    for num_tokens in range(1, 4097):
        assert buckets.key(1, num_tokens)[1] == min(b for b in buckets.token_buckets if b >= num_tokens)
    assert buckets.key(3, 10) == (4, 64) and buckets.key(64, 64) == (64, 64)
    assert buckets.key(1, 4097) is None and buckets.key(65, 100) is None


def test_lazy_cache_first_eager_second_capture_then_replay():
    cache = LazyGraphCache(max_graphs=1)
    assert cache.action("a") == EAGER
    assert cache.action("a") == CAPTURE
    cache.store("a", "graph-a")
    assert [cache.action("a") for _ in range(3)] == [REPLAY] * 3 and cache.get("a") == "graph-a"
    assert cache.action("b") == EAGER and cache.action("b") == EAGER  # full: b stays eager
    cache.max_graphs = None
    assert cache.action("b") == CAPTURE
    cache.mark_failed("b")
    assert cache.action("b") == EAGER


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import BertConfig, BertModel, Qwen3Model

    qwen3 = tmp_path_factory.mktemp("qwen3")
    save_random_model(Qwen3Model, qwen3_config(), qwen3, seed=21)
    bert_cls = tmp_path_factory.mktemp("bert")
    save_random_model(BertModel, BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, max_position_embeddings=512), bert_cls, seed=22)
    bert_mean = tmp_path_factory.mktemp("bert_mean")
    for name in ("config.json", "model.safetensors"):
        (bert_mean / name).write_bytes((bert_cls / name).read_bytes())
    write_pooling(bert_cls, "cls")
    minilm = tmp_path_factory.mktemp("minilm_shape")  # all-MiniLM-L6-v2's shape: head_dim 32, token types
    save_random_model(BertModel, BertConfig(vocab_size=128, hidden_size=384, intermediate_size=1536, num_hidden_layers=2,
                                            num_attention_heads=12, type_vocab_size=2, max_position_embeddings=512),
                      minilm, seed=29)
    write_pooling(minilm, "mean")
    return {"qwen3": qwen3, "bert-cls": bert_cls, "bert-mean": bert_mean, "minilm-shape": minilm}


def random_batches(seed: int, count: int, max_len: int = 150, token_types: bool = False):
    """Random batches of 1-5 sequences; `token_types`: each sequence a random (segment 0, segment 1) pair."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        lengths = rng.integers(1, max_len, size=rng.integers(1, 6))
        sequences = random_sequences(lengths, 128, seed=int(rng.integers(1 << 30)))
        types = [(np.arange(n) >= rng.integers(0, n + 1)).astype(np.int64) for n in lengths] if token_types else None
        yield PackedBatch.from_sequences(sequences, types)


@pytest.mark.parametrize("family", ["qwen3", "bert-cls", "bert-mean", "minilm-shape"])
def test_graph_steps_equal_eager_and_counters_add_up(folders, family):
    eager = ModelRunner(str(folders[family]), device="cpu", attention_backend="masked", cuda_graphs="off")
    capture = FakeCapture()
    graphed = ModelRunner(str(folders[family]), device="cpu", attention_backend="masked", cuda_graphs="on",
                     max_graph_tokens=512, max_graph_seqs=8, graph_capture=capture)
    batches = list(random_batches(seed=23, count=8, token_types=family == "minilm-shape")) * 3  # each bucket 3+ times
    hits: dict = {}
    for batch in batches:
        np.testing.assert_allclose(graphed.step(batch).wait(), eager.step(batch).wait(), atol=1e-5, rtol=1e-4)
        key = graphed.graphs.buckets.key(batch.num_seqs, batch.num_tokens)
        hits[key] = hits.get(key, 0) + 1
    stats = graphed.stats
    assert stats.eager_runs + stats.captures + stats.replays == len(batches)
    assert stats.captures == capture.calls == stats.graphs == sum(1 for n in hits.values() if n >= 2)
    assert stats.eager_runs == len(hits) and stats.replays == sum(n - 2 for n in hits.values() if n >= 2)


def test_returned_rows_survive_later_replays(folders):
    engine = ModelRunner(str(folders["qwen3"]), device="cpu", attention_backend="masked", cuda_graphs="on",
                    graph_capture=FakeCapture())
    first = PackedBatch.from_sequences(random_sequences([10, 20], 128, seed=24))
    second = PackedBatch.from_sequences(random_sequences([15, 12], 128, seed=25))
    for _ in range(2):
        engine.step(first).wait()
    kept = engine.step(first).wait()  # a replay
    expected = kept.copy()
    engine.step(second).wait()  # replays the same (2, 64) graph over the same static output
    assert engine.stats.replays == 2
    np.testing.assert_array_equal(kept, expected)


def test_above_the_largest_bucket_runs_eagerly(folders):
    capture = FakeCapture()
    engine = ModelRunner(str(folders["qwen3"]), device="cpu", attention_backend="masked", cuda_graphs="on",
                    max_graph_tokens=128, max_graph_seqs=2, graph_capture=capture)
    for lengths in ([100, 100], [5, 5, 5], [100, 100]):
        engine.step(PackedBatch.from_sequences(random_sequences(lengths, 128)))
    assert engine.stats.eager_runs == 3 and capture.calls == 0


def test_failed_capture_falls_back_to_eager(folders):
    capture = FakeCapture(fail=True)
    engine = ModelRunner(str(folders["qwen3"]), device="cpu", attention_backend="masked", cuda_graphs="on",
                    graph_capture=capture)
    batch = PackedBatch.from_sequences(random_sequences([7], 128))
    results = [engine.step(batch).wait() for _ in range(4)]
    assert capture.calls == 1 and engine.stats.capture_failures == 1 and engine.stats.eager_runs == 4
    np.testing.assert_allclose(results[-1], results[0], atol=1e-5, rtol=1e-4)  # padded graph step vs plain eager


def test_graph_mode_configuration(folders):
    folder = str(folders["qwen3"])
    assert ModelRunner(folder, device="cpu").graphs is None  # auto: no CUDA, no graphs
    with pytest.raises(ValueError, match="cuda_graphs=on needs CUDA"):
        ModelRunner(folder, device="cpu", attention_backend="masked", cuda_graphs="on")
    with pytest.raises(ValueError, match="capturable"):
        ModelRunner(folder, device="cpu", attention_backend="sdpa", cuda_graphs="on", graph_capture=FakeCapture())
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        ModelRunner(folder, device="cpu", cuda_graphs="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3", "minilm-shape"])
@pytest.mark.parametrize("backend", ["auto", "masked"])
def test_gpu_graph_replay_equals_eager(folders, family, backend):
    folder = str(folders[family])
    eager = ModelRunner(folder, device="cuda", attention_backend=backend, cuda_graphs="off")
    graphed = ModelRunner(folder, device="cuda", attention_backend=backend, cuda_graphs="on", max_graph_tokens=512)
    batches = list(random_batches(seed=26, count=6, token_types=family == "minilm-shape")) * 3
    lazies = [(graphed.step(b), eager.step(b)) for b in batches]  # several batches in flight at once
    for got, want in lazies:
        np.testing.assert_allclose(got.wait(), want.wait(), atol=2e-2, rtol=2e-2)
    assert graphed.stats.replays > 0 and graphed.stats.capture_failures == 0


def test_max_seqlen_bucket_is_a_power_of_two_capped_by_model_and_tokens():
    buckets = GraphBuckets(max_tokens=4096, max_seqs=64, max_seqlen_cap=512)
    assert buckets.key(1, 10, 10) == (1, 64, 64)
    assert buckets.key(4, 400, 100) == (4, 448, 128)
    assert buckets.key(2, 900, 450) == (2, 960, 512)
    assert buckets.key(8, 3000, 512) == (8, 3072, 512)  # capped by the model's maximum
    assert buckets.key(1, 300, 300) == (1, 320, 320)    # capped by the token bucket
    for num_seqs, num_tokens, max_seqlen in ((3, 70, 65), (16, 4096, 300), (1, 512, 512)):
        seqs, tokens, seqlen = buckets.key(num_seqs, num_tokens, max_seqlen)
        assert seqlen >= max_seqlen and tokens >= num_tokens and seqs >= num_seqs


def test_grid_covers_odd_budgets():
    buckets = GraphBuckets(max_tokens=8200, max_seqs=256)  # rounded up to the 64-token step
    assert buckets.max_tokens == 8256 and buckets.key(256, 8200) == (256, 8256)
    assert buckets.covers(8256, 256) and not buckets.covers(8257, 256) and not buckets.covers(64, 257)


class FailingPlanBackend:
    """The masked backend whose graph plan fails for one bucket (as a planner could on a GPU)."""

    def __init__(self, backend, failing_tokens: int):
        self._backend, self.failing_tokens, self.calls = backend, failing_tokens, 0

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def graph_plan(self, num_seqs, num_tokens, device, max_seqlen):
        self.calls += 1
        if num_tokens == self.failing_tokens:
            raise RuntimeError("injected plan failure")
        return self._backend.graph_plan(num_seqs, num_tokens, device, max_seqlen)


def test_failed_plan_falls_back_to_eager_for_that_bucket_only(folders):
    capture = FakeCapture()
    engine = ModelRunner(str(folders["qwen3"]), device="cpu", attention_backend="masked", cuda_graphs="on",
                    graph_capture=capture)
    eager = ModelRunner(str(folders["qwen3"]), device="cpu", attention_backend="masked", cuda_graphs="off")
    engine.graphs.backend = FailingPlanBackend(engine.backend, failing_tokens=128)
    small = PackedBatch.from_sequences(random_sequences([20], 128, seed=27))    # bucket (1, 64)
    large = PackedBatch.from_sequences(random_sequences([100], 128, seed=28))   # bucket (1, 128): fails
    for batch in (large, small, large, small, large, small):
        np.testing.assert_allclose(engine.step(batch).wait(), eager.step(batch).wait(), atol=1e-5, rtol=1e-4)
    stats = engine.stats
    assert stats.capture_failures == 1 and engine.graphs.backend.calls == 2  # planned once per bucket
    assert stats.eager_runs == 3 + 1 and stats.captures == 1 and stats.replays == 1


@pytest.mark.gpu
def test_gpu_failed_capture_restores_the_stream_and_later_captures_work():
    from engine_lib.runner.cuda_graphs import CudaGraphCapture

    capture = CudaGraphCapture(torch.device("cuda"))
    x = torch.ones(16, device="cuda")
    calls = []

    def failing():
        calls.append(torch.cuda.is_current_stream_capturing())
        if calls[-1]:
            raise RuntimeError("injected failure inside capture")
        return x * 2

    before = torch.cuda.current_stream()
    with pytest.raises(RuntimeError, match="injected"):
        capture(failing)
    assert torch.cuda.current_stream() == before and not torch.cuda.is_current_stream_capturing()
    replay, output = capture(lambda: x * 3)
    x.fill_(2)
    replay()
    torch.cuda.synchronize()
    assert output.tolist() == [6.0] * 16


@pytest.mark.gpu
def test_a_runner_on_the_last_gpu_steps_there_from_another_thread(folders):
    """device=cuda:N (a KIND_GPU instance): weights, graphs and results on that GPU, whichever
    thread calls step (CUDA's current device is per thread)."""
    import threading

    index = torch.cuda.device_count() - 1
    runner = ModelRunner(folders["bert-mean"], device=f"cuda:{index}", dtype="float32", cuda_graphs="on",
                         attention_backend="masked", self_check=False)
    assert runner.device == torch.device("cuda", index)
    assert next(runner.model.parameters()).device == runner.device
    batch = PackedBatch.from_sequences(random_sequences([8, 16], 128, seed=25))
    with torch.inference_mode():  # as step runs it
        eager = runner.forward_eager(batch).cpu().numpy()
    rows = []
    thread = threading.Thread(target=lambda: rows.extend(runner.step(batch).wait() for _ in range(3)), daemon=True)
    thread.start()
    thread.join(120)
    assert len(rows) == 3
    for row in rows:
        np.testing.assert_allclose(row, eager, atol=1e-4)

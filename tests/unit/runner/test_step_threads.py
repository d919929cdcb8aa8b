"""StepThreads: one intra-op thread for small steps, up to the maximum for big ones."""
import numpy as np
import torch

from engine_lib.contract import PackedBatch
from engine_lib.runner.step_threads import StepThreads, flops_per_token
from testing.fake_engine import FakeEngine


def batch(num_tokens: int) -> PackedBatch:
    return PackedBatch.from_sequences([np.arange(num_tokens) % 900 + 1])


def test_threads_follow_each_steps_work_and_change_only_when_needed():
    calls = []
    engine = StepThreads(FakeEngine(), max_threads=4, flops_per_token=1e6, set_threads=calls.append,
                         min_flops_per_thread=50e6)
    assert (engine.output_dim, engine.max_positions, engine.vocab_size, engine.task) == (4, 64, 1000, "embed")
    assert [engine.threads_for(n) for n in (1, 99, 100, 149, 150, 10_000)] == [1, 1, 2, 2, 3, 4]
    for num_tokens in (10, 20, 120, 130, 10):
        engine.step(batch(num_tokens))
    assert calls == [1, 2, 1]
    assert [len(b[0]) for b in engine.engine.batches] == [10, 20, 120, 130, 10]


def test_flops_per_token_counts_weight_matrices_but_not_embedding_tables():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 4), torch.nn.Linear(4, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 2, bias=False))
    assert flops_per_token(model) == 2 * (4 * 8 + 8 * 2)

"""Intra-op threads per engine step on CPU: one thread for small steps, all for big ones.

The encoder shares the CPU cores with Triton, the other models' stubs and
often the clients. An OpenMP team makes every parallel region wait for its
slowest thread (descheduled whenever another process runs on its core), and
its idle threads spin on cores the rest of the server needs. Below about
`MIN_FLOPS_PER_THREAD` of work per extra thread the team costs more than it
gains (the `overhead` benchmark profile, docs/benchmarks.md).
"""
from __future__ import annotations

from typing import Callable

from engine_lib.contract import LazyTensor, PackedBatch

MIN_FLOPS_PER_THREAD = 50e6  # ~1 ms of one core's work


def flops_per_token(model) -> float:
    """2 x the weights a token passes through (every matrix except embedding tables; packed Linears too)."""
    import torch

    from engine_lib.models.cpu_linear import PACKED_TYPES

    tables = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    dense = sum(p.numel() for p in model.parameters() if p.ndim >= 2 and id(p) not in tables)
    packed_only = sum(m.in_features * m.out_features for m in model.modules()
                      if isinstance(m, PACKED_TYPES) and m.plain is None)  # a kept plain weight is counted in `dense`
    return 2.0 * (dense + packed_only)


class StepThreads:
    """A Engine that sets the intra-op thread count for each step, then runs it on `engine`."""

    def __init__(self, engine, max_threads: int, flops_per_token: float,
                 set_threads: Callable[[int], None], min_flops_per_thread: float = MIN_FLOPS_PER_THREAD):
        self.engine = engine
        self.max_threads, self.flops_per_token = max_threads, flops_per_token
        self.min_flops_per_thread = min_flops_per_thread
        self._set_threads = set_threads
        # `max_threads` is the count in force when built: setting it again from the scheduler
        # thread cost ~15% of mixed-length throughput with all-MiniLM on 2 cores (measured).
        self._current = max_threads

    def __getattr__(self, name: str):
        """The rest of the engine contract (output_dim, max_positions, ...) is the wrapped engine's."""
        return getattr(self.engine, name)

    def threads_for(self, num_tokens: int) -> int:
        wanted = int(num_tokens * self.flops_per_token // self.min_flops_per_thread)
        return max(1, min(self.max_threads, wanted))

    def step(self, batch: PackedBatch) -> LazyTensor:
        threads = self.threads_for(batch.num_tokens)
        if threads != self._current:
            self._set_threads(threads)
            self._current = threads
        return self.engine.step(batch)

"""The engine as the service sees it: `step(PackedBatch) -> LazyTensor` plus the model's limits."""
from __future__ import annotations

from typing import Protocol

from .batch import PackedBatch
from .lazy_tensor import LazyTensor


class StepEngine(Protocol):
    hidden_size: int    # width of each pooled row `step` returns
    max_positions: int  # longest sequence the model takes
    vocab_size: int     # token ids must lie in [0, vocab_size)

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch`; the LazyTensor resolves to fp32 [num_seqs, hidden_size]."""
        ...

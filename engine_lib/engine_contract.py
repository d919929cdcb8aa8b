"""The engine as the service sees it: `step(PackedBatch) -> LazyTensor` plus the model's limits."""
from __future__ import annotations

from typing import Protocol

from .batch import PackedBatch
from .lazy_tensor import LazyTensor


class StepEngine(Protocol):
    output_dim: int     # width of each row `step` returns (hidden size for embeddings, 1 for scores)
    max_positions: int  # longest sequence the model takes
    vocab_size: int     # token ids must lie in [0, vocab_size)
    type_vocab_size: int  # segment ids must lie in [0, type_vocab_size) (1: the model has none)
    task: str           # "embed" or "score" (engine_lib/outputs.py turns rows into answers)

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch` (its `token_types` may be None); the LazyTensor
        resolves to fp32 [num_seqs, output_dim]."""
        ...

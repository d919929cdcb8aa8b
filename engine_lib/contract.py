"""The engine's plain data: `RaggedTokens` from a tokenizer to the service, `PackedBatch` from the
service to the runner, `LazyTensor` back, `Engine` between.

Plain data and protocols only (numpy, no torch): the tokenizers, the gateway, the service, the
scheduler and their fakes import this, never the runner."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class RaggedTokens:
    """One request's token sequences end to end, no padding, and its options: what every tokenizer
    (the tokenizer models, the unary fronts, the gateway) hands the encoder, and what the service
    queues (a batch takes slices of it into its PackedBatch, service/batching.py `gather`).

    Built from token lists by `from_rows`; the encoder rebuilds it from the wire tensors after
    checking them (service/endpoint.py `check_request`)."""
    input_ids: np.ndarray                  # [num_tokens] int64, all sequences concatenated
    seq_lens: np.ndarray                   # [num_seqs] int64, each >= 1
    token_types: np.ndarray | None = None  # [num_tokens] int64 segment ids (BERT pairs); None: all 0
    windows: np.ndarray | None = None      # [num_texts] int64 sequences per text (chunking=mean); None: one each
    options: Any = None                    # the request's RequestOptions or RerankOptions

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None = None,
                  windows: Sequence[int] | None = None, options: Any = None) -> "RaggedTokens":
        """Token id lists (and their segment id lists, and sequences per text) -> the ragged form."""
        return cls(_flat(rows), np.array([len(r) for r in rows], dtype=np.int64),
                   None if type_rows is None else _flat(type_rows),
                   None if windows is None else np.asarray(windows, dtype=np.int64), options)

    @cached_property
    def lengths(self) -> list[int]:
        """`seq_lens` as Python ints (the scheduler's per-sequence bookkeeping)."""
        return self.seq_lens.tolist()

    @property
    def num_texts(self) -> int:
        return len(self.seq_lens) if self.windows is None else len(self.windows)

    @property
    def offsets(self) -> np.ndarray:
        """Sequence i's ids are input_ids[offsets[i]:offsets[i + 1]]."""
        return np.concatenate([[0], np.cumsum(self.seq_lens)])

    @property
    def window_offsets(self) -> np.ndarray:
        """Text i's sequences are seq_lens[window_offsets[i]:window_offsets[i + 1]]."""
        counts = self.windows if self.windows is not None else np.ones(len(self.seq_lens), dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)])

    @property
    def text_tokens(self) -> list[int]:
        """Tokens per text (all its windows')."""
        if self.windows is None:
            return self.lengths
        return np.add.reduceat(self.seq_lens, self.window_offsets[:-1]).tolist()


def _flat(rows: Sequence[Sequence[int]]) -> np.ndarray:
    if len(rows) == 1:
        return np.array(rows[0], dtype=np.int64)
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=sum(map(len, rows)))


@dataclass(frozen=True)
class PackedBatch:
    input_ids: np.ndarray   # [num_tokens] int64, all sequences concatenated
    positions: np.ndarray   # [num_tokens] int64, position inside its sequence
    cu_seqlens: np.ndarray  # [num_seqs + 1] int32, cu_seqlens[0] == 0
    max_seqlen: int
    token_types: np.ndarray | None = None  # [num_tokens] int64 segment ids (BERT pairs); None = all 0
    # [num_seqs] bool: the sequence's request has input_type query (a ColBERT model encodes queries
    # and documents differently); None = no query
    queries: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def seq_lens(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    @cached_property
    def seq_ids(self) -> np.ndarray:
        """[num_tokens] int64: the index of the sequence each token belongs to."""
        return np.repeat(np.arange(self.num_seqs, dtype=np.int64), self.seq_lens)

    @classmethod
    def from_flat(cls, input_ids: np.ndarray, seq_lens: Sequence[int],
                  token_types: np.ndarray | None = None, queries: np.ndarray | None = None) -> "PackedBatch":
        """Sequences already laid end to end: `input_ids` [num_tokens] (kept as is when int64),
        `seq_lens` their lengths in order, `token_types` [num_tokens] segment ids or None (all 0)."""
        if not len(seq_lens):
            raise ValueError("a batch needs at least one sequence")
        lens = np.asarray(seq_lens, dtype=np.int64)
        if (lens < 1).any():
            raise ValueError("every sequence needs at least one token")
        cu_seqlens = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=cu_seqlens[1:])
        input_ids = np.asarray(input_ids, dtype=np.int64)
        if input_ids.shape != (int(cu_seqlens[-1]),):
            raise ValueError(f"input_ids has shape {input_ids.shape}; the lengths add up to {int(cu_seqlens[-1])}")
        if token_types is not None:
            token_types = np.asarray(token_types, dtype=np.int64)
            if token_types.shape != input_ids.shape:
                raise ValueError("token_types must have one entry per token")
        positions = np.arange(len(input_ids), dtype=np.int64) - np.repeat(cu_seqlens[:-1].astype(np.int64), lens)
        if queries is not None and len(queries) != len(lens):
            raise ValueError("queries must have one entry per sequence")
        return cls(input_ids, positions, cu_seqlens, int(lens.max()), token_types, queries)

    @classmethod
    def from_sequences(cls, sequences: Sequence[np.ndarray],
                       token_types: Sequence[np.ndarray | None] | None = None) -> "PackedBatch":
        """One array per sequence (tests, benchmarks); `token_types[i]`: segment ids of sequence i
        (same length) or None (all 0)."""
        if not sequences:
            raise ValueError("a batch needs at least one sequence")
        lens = [len(s) for s in sequences]
        input_ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
        types = None
        if token_types is not None and any(t is not None for t in token_types):
            if any(t is not None and len(t) != n for t, n in zip(token_types, lens)):
                raise ValueError("token_types must have one entry per token")
            types = np.concatenate([np.zeros(n, dtype=np.int64) if t is None else np.asarray(t, dtype=np.int64)
                                    for n, t in zip(lens, token_types)])
        return cls.from_flat(input_ids, lens, types)


class LazyTensor(Protocol):
    """A result that may still be in flight on the accelerator (engine_lib/device/lazy_tensor.py)."""

    def ready(self) -> bool:
        """True when `wait()` will not block (the service then answers without a thread hand-off)."""
        ...

    def wait(self) -> np.ndarray:
        """The host array, fp32 [num_seqs, output_dim]."""
        ...


class Engine(Protocol):
    """The engine as the service sees it: `step(PackedBatch) -> LazyTensor` plus the model's limits."""

    output_dim: int     # width of each row `step` returns (hidden size for embeddings, 1 for scores)
    max_positions: int  # longest sequence the model takes
    vocab_size: int     # token ids must lie in [0, vocab_size)
    type_vocab_size: int  # segment ids must lie in [0, type_vocab_size) (1: the model has none)
    task: str           # "embed" or "score" (engine_lib/service/outputs.py turns rows into answers)

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch` (its `token_types` may be None); the LazyTensor
        resolves to fp32 [num_seqs, output_dim]."""
        ...

"""Encoder requests: validation in, post-processing out, around an EncoderService.

A request is flat INPUT_IDS + SEQ_LENS (as the tokenizer model emits them) and
RequestOptions. `Encoder.submit` checks them against the engine's limits
(InputError names the field), hands the sequences to the service, and turns
the service's raw rows into the answer (Matryoshka cut, L2 normalisation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .errors import InputError
from .options import RequestOptions
from .serving import DoneCallback, EncoderService


@dataclass(frozen=True)
class EncoderLimits:
    max_positions: int
    vocab_size: int
    output_dim: int
    max_request_tokens: int  # a request larger than the whole queue can never be admitted

    @classmethod
    def of(cls, service: EncoderService) -> "EncoderLimits":
        engine = service.engine
        return cls(engine.max_positions, engine.vocab_size, engine.hidden_size, service.max_queued_tokens)


def split_sequences(input_ids: np.ndarray, seq_lens: np.ndarray, limits: EncoderLimits) -> list[np.ndarray]:
    """Flat ids + lengths -> one int64 array per sequence, or InputError naming the problem."""
    if input_ids.ndim != 1 or seq_lens.ndim != 1:
        raise InputError(f"INPUT_IDS and SEQ_LENS must be 1-D, got shapes {list(input_ids.shape)} and {list(seq_lens.shape)}")
    if seq_lens.size == 0:
        raise InputError("SEQ_LENS is empty: send at least one sequence")
    if (seq_lens < 1).any():
        raise InputError(f"SEQ_LENS[{int(np.argmax(seq_lens < 1))}] is {int(seq_lens.min())}; every sequence needs >= 1 token")
    if int(seq_lens.sum()) != input_ids.size:
        raise InputError(f"SEQ_LENS sums to {int(seq_lens.sum())} but INPUT_IDS has {input_ids.size} tokens")
    longest = int(seq_lens.max())
    if longest > limits.max_positions:
        raise InputError(f"SEQ_LENS[{int(np.argmax(seq_lens))}] is {longest} tokens; the model takes at most {limits.max_positions}")
    if input_ids.size > limits.max_request_tokens:
        raise InputError(f"request has {input_ids.size} tokens, more than the encoder queue holds "
                         f"(max_queued_tokens={limits.max_request_tokens}); split it")
    if input_ids.min() < 0 or input_ids.max() >= limits.vocab_size:
        raise InputError(f"INPUT_IDS holds ids outside [0, {limits.vocab_size})")
    bounds = np.concatenate([[0], np.cumsum(seq_lens)])
    ids = input_ids.astype(np.int64, copy=False)
    return [ids[bounds[i]:bounds[i + 1]] for i in range(seq_lens.size)]


def check_options(options: RequestOptions, limits: EncoderLimits) -> None:
    if options.dimensions > limits.output_dim:
        raise InputError(f"parameter 'dimensions' is {options.dimensions}; the model has {limits.output_dim}")


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def finish_rows(rows: np.ndarray, options: RequestOptions) -> np.ndarray:
    """Raw pooled rows [N, H] -> the answer: first `dimensions` columns, then normalised; fp32, contiguous."""
    if options.dimensions:
        rows = rows[:, :options.dimensions]
    if options.normalize:
        rows = normalize_rows(rows)
    return np.ascontiguousarray(rows, dtype=np.float32)


class Encoder:
    """What the encoder model's adapter calls: validated requests in, finished rows out."""

    def __init__(self, service: EncoderService):
        self.service = service
        self.limits = EncoderLimits.of(service)

    def submit(self, input_ids: np.ndarray, seq_lens: np.ndarray, options: RequestOptions,
               on_done: DoneCallback, is_cancelled: Optional[Callable[[], bool]] = None,
               received_at: Optional[float] = None) -> int:
        """Queue one request; raises InputError/OverloadError before queuing anything.
        `received_at`: time.perf_counter() when the adapter got it (hop timing)."""
        try:
            sequences = split_sequences(input_ids, seq_lens, self.limits)
            check_options(options, self.limits)
        except InputError:
            self.service.metrics.count("rose_requests_total", outcome="invalid")
            raise

        def finish(rows, error):
            on_done(None if rows is None else finish_rows(rows, options), error)

        return self.service.submit(sequences, finish, is_cancelled, received_at)

    def close(self, timeout: float = 60.0) -> None:
        self.service.close(timeout)

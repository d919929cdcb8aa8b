"""Endpoint requests: validation in, post-processing out, around an BatchingService.

A request is a RaggedTokens (engine_lib/contract.py) built from its wire tensors: flat INPUT_IDS
+ SEQ_LENS (as the tokenizer models emit them), optionally flat TOKEN_TYPE_IDS (segment ids of
BERT pairs) or TEXT_WINDOWS, and its options (RequestOptions for embeddings, RerankOptions for
scores). `Endpoint.submit` checks them against the engine's limits (InputError names the field),
hands them to the service in the request's priority class (its
`priority` option, else engine_lib.options.default_priority by its size), and turns the service's raw
rows into the answer (engine_lib/service/outputs.py: {tensor name: array}, embedding rows in the
types the request names, or scores). int8/uint8 rows wait for the model's
calibration (calibration.py) the first time; a request for the ranges alone
(`int8_ranges`) is answered from it without running its sequences.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import default_priority
from engine_lib.service.batching import BatchingService, DoneCallback
from engine_lib.service.outputs import output_for, pool_windows
from rose_wire import INPUT_IDS, SEQ_LENS, TEXT_WINDOWS, TOKEN_TYPE_IDS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointLimits:
    max_positions: int
    vocab_size: int
    output_dim: int
    max_request_tokens: int  # a request larger than the whole queue can never be admitted
    type_vocab_size: int = 1

    @classmethod
    def of(cls, service: BatchingService) -> "EndpointLimits":
        engine = service.engine
        return cls(engine.max_positions, engine.vocab_size, engine.output_dim, service.max_queued_tokens,
                   engine.type_vocab_size)


def check_request(tokens: RaggedTokens, limits: EndpointLimits) -> RaggedTokens:
    """The wire's arrays (any dtype) -> validated int64 RaggedTokens, or InputError naming the field.
    The ids stay flat: the service gathers each batch's slices of them once (service/batching.py)."""
    input_ids, lens = _check_sequences(tokens.input_ids, tokens.seq_lens, limits)
    token_types = _check_token_types(tokens.token_types, input_ids.size, limits)
    windows = _check_windows(tokens.windows, len(lens))
    return RaggedTokens(input_ids, tokens.seq_lens.astype(np.int64, copy=False), token_types, windows,
                        tokens.options)


def _check_sequences(input_ids: np.ndarray, seq_lens: np.ndarray,
                     limits: EndpointLimits) -> tuple[np.ndarray, list[int]]:
    if input_ids.ndim != 1 or seq_lens.ndim != 1:
        raise InputError(f"INPUT_IDS and SEQ_LENS must be 1-D, got shapes {list(input_ids.shape)} and "
                         f"{list(seq_lens.shape)}", field=INPUT_IDS if input_ids.ndim != 1 else SEQ_LENS)
    if seq_lens.size == 0:
        raise InputError("SEQ_LENS is empty: send at least one sequence", field=SEQ_LENS)
    lens = seq_lens.tolist()  # a few sequences per request: Python ints beat numpy calls
    shortest, longest, total = min(lens), max(lens), sum(lens)
    if shortest < 1:
        raise InputError(f"SEQ_LENS[{lens.index(shortest)}] is {shortest}; every sequence needs >= 1 token",
                         field=SEQ_LENS)
    if total != input_ids.size:
        raise InputError(f"SEQ_LENS sums to {total} but INPUT_IDS has {input_ids.size} tokens", field=SEQ_LENS)
    if longest > limits.max_positions:
        raise InputError(f"SEQ_LENS[{lens.index(longest)}] is {longest} tokens; the model takes at most "
                         f"{limits.max_positions}", field=SEQ_LENS)
    if input_ids.size > limits.max_request_tokens:
        raise InputError(f"request has {input_ids.size} tokens, more than the encoder queue holds "
                         f"(max_queued_tokens={limits.max_request_tokens}); split it", field=INPUT_IDS)
    if input_ids.min() < 0 or input_ids.max() >= limits.vocab_size:
        raise InputError(f"INPUT_IDS holds ids outside [0, {limits.vocab_size})", field=INPUT_IDS)
    return input_ids.astype(np.int64, copy=False), lens


def _check_token_types(token_types: Optional[np.ndarray], num_tokens: int,
                       limits: EndpointLimits) -> Optional[np.ndarray]:
    """Flat segment ids (one per token) as int64; None or empty: the model's single segment."""
    if token_types is None or token_types.size == 0:
        return None
    if token_types.ndim != 1 or token_types.size != num_tokens:
        raise InputError(f"TOKEN_TYPE_IDS has shape {list(token_types.shape)}; send one id per token "
                         f"({num_tokens}) or none", field=TOKEN_TYPE_IDS)
    if token_types.min() < 0 or token_types.max() >= limits.type_vocab_size:
        raise InputError(f"TOKEN_TYPE_IDS holds ids outside [0, {limits.type_vocab_size})", field=TOKEN_TYPE_IDS)
    return token_types.astype(np.int64, copy=False)


def _check_windows(windows: Optional[np.ndarray], num_sequences: int) -> Optional[np.ndarray]:
    """Sequences per text (chunking), each >= 1, summing to the sequences sent; None or empty: one each."""
    if windows is None or windows.size == 0:
        return None
    if windows.ndim != 1 or windows.min() < 1 or int(windows.sum()) != num_sequences:
        raise InputError(f"TEXT_WINDOWS must count >= 1 sequence per text and sum to the {num_sequences} "
                         f"sequences of SEQ_LENS", field=TEXT_WINDOWS)
    return windows.astype(np.int64, copy=False)


class Endpoint:
    """What the encoder model's adapter calls: validated requests in, finished answers out."""

    def __init__(self, service: BatchingService, output=None, calibration=None):
        self.service = service
        self.limits = EndpointLimits.of(service)
        self.output = output or output_for(service.engine)  # EmbeddingOutput or ScoreOutput
        self.calibration = calibration  # calibration.Calibration: int8 ranges (None: int8/uint8 refused)

    def submit(self, tokens: RaggedTokens, on_done: DoneCallback,
               is_cancelled: Optional[Callable[[], bool]] = None, received_at: Optional[float] = None,
               trace: Optional[Callable] = None) -> int:
        """Queue one request (its options are `tokens.options`); raises InputError/OverloadError
        before queuing anything. `on_done` gets ({tensor name: array}, None) or (None, error).
        `received_at`: time.perf_counter() when the adapter got it (hop timing). A text of several
        sequences (`tokens.windows`, chunking=mean) is pooled into one row (outputs.pool_windows)
        before the answer is made. `trace`: the request's trace hook (batching.py,
        engine_lib/tracing.py), None when it is not traced."""
        options = tokens.options
        needs_ranges = self.output.needs_ranges(options)
        try:
            tokens = check_request(tokens, self.limits)
            self.output.check(options)
            if needs_ranges and self.calibration is None:
                raise InputError("this encoder has no calibration for int8/uint8 outputs", "embedding_types")
        except InputError:
            self.service.metrics.count("rose_requests_total", outcome="invalid")
            raise

        def answer(rows, error):
            result = None
            if error is None:
                try:
                    result = self.output.answer(rows, options, self.calibration)
                except Exception as exc:  # answered as an error: a request is never left without one
                    log.exception("post-processing the rows failed")
                    error = RuntimeError(f"post-processing the rows failed: {exc!r}")
            on_done(result, error)  # if this raises, the service answers the request with an error

        def finish(rows, error):
            if rows is not None and tokens.windows is not None:
                rows = pool_windows(rows, tokens.lengths, tokens.windows)
            if rows is None or not needs_ranges:
                answer(rows, error)
            else:
                self.calibration.when_ready(self.service.submit, lambda failed: answer(rows, failed))

        if self.output.only_ranges(options):
            self.calibration.when_ready(self.service.submit, lambda failed: answer(None, failed))
            return 0
        priority = getattr(options, "priority", "") or default_priority(len(tokens.lengths), tokens.input_ids.size)
        return self.service.submit(tokens, finish, is_cancelled, received_at, priority, trace=trace)

    def gauges(self) -> dict:
        """Queue depth (in all and by class), the load-time self-check figure (labelled with the device and
        dtype served) and the batch token budget (for the metrics thread; a labelled series is keyed
        (name, labels))."""
        by_class = {("rose_queue_sequences", (("priority", p),)): n for p, n in self.service.class_depth().items()}
        engine = self.service.engine
        served = (("device", str(getattr(engine, "device", "cpu"))),
                  ("dtype", str(getattr(engine, "dtype", "float32")).removeprefix("torch.")))
        return {**self.service.queue_depth(), **by_class,
                ("rose_self_check_cosine", served): getattr(engine, "self_check_cosine", 1.0),
                "rose_batch_token_budget": self.service.max_batch_tokens}

    def close(self, timeout: float = 60.0) -> None:
        self.service.close(timeout)

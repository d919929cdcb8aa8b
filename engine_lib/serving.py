"""EncoderService: request pool -> FCFS batches -> engine.step -> responses.

Two threads. The scheduler thread pops batches from the FcfsBatcher and
launches them (`engine.step` returns a LazyTensor at once); at most
`max_inflight_batches` are in flight, so batch N+1 is prepared and launched
while batch N runs. The completion thread waits on LazyTensors in launch
order, scatters rows into their requests and calls each request's `on_done`
exactly once, when all its sequences are done (or with an error).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .batch import PackedBatch
from .errors import InputError, OverloadError
from .options import RequestOptions
from .pooling import normalize_rows
from .scheduler import FcfsBatcher, ScheduledSequence

log = logging.getLogger(__name__)

DoneCallback = Callable[[Optional[np.ndarray], Optional[Exception]], None]


@dataclass
class _PooledRequest:
    sequences: list[np.ndarray]
    options: RequestOptions
    on_done: DoneCallback
    rows: np.ndarray
    remaining: int
    finished: bool = False


@dataclass
class ServiceStats:
    batches: int = 0
    sequences: int = 0
    tokens: int = 0
    requests_done: int = 0
    requests_failed: int = 0


class EncoderService:
    def __init__(self, engine, max_batch_tokens: int, max_batch_sequences: int,
                 max_inflight_batches: int = 2, max_queued_tokens: int = 1 << 20):
        self.engine = engine
        self.output_dim = engine.hidden_size
        self.max_queued_tokens = max_queued_tokens
        self.stats = ServiceStats()
        self._batcher = FcfsBatcher(max_batch_tokens, max_batch_sequences)
        self._requests: dict[int, _PooledRequest] = {}
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._closing = False
        self._inflight = threading.Semaphore(max_inflight_batches)
        self._launched: queue.Queue = queue.Queue()
        self._scheduler = threading.Thread(target=self._schedule_loop, name="rose-scheduler", daemon=True)
        self._completer = threading.Thread(target=self._complete_loop, name="rose-completion", daemon=True)
        self._scheduler.start()
        self._completer.start()

    def validate(self, input_ids: np.ndarray, seq_lens: np.ndarray, options: RequestOptions) -> list[np.ndarray]:
        if input_ids.ndim != 1 or seq_lens.ndim != 1:
            raise InputError(f"INPUT_IDS and SEQ_LENS must be 1-D, got shapes {list(input_ids.shape)} and {list(seq_lens.shape)}")
        if seq_lens.size == 0:
            raise InputError("SEQ_LENS is empty: send at least one sequence")
        if (seq_lens < 1).any():
            raise InputError(f"SEQ_LENS[{int(np.argmax(seq_lens < 1))}] is {int(seq_lens.min())}; every sequence needs >= 1 token")
        if int(seq_lens.sum()) != input_ids.size:
            raise InputError(f"SEQ_LENS sums to {int(seq_lens.sum())} but INPUT_IDS has {input_ids.size} tokens")
        longest = int(seq_lens.max())
        if longest > self.engine.max_positions:
            raise InputError(f"SEQ_LENS[{int(np.argmax(seq_lens))}] is {longest} tokens; the model takes at most {self.engine.max_positions}")
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.engine.vocab_size):
            raise InputError(f"INPUT_IDS holds ids outside [0, {self.engine.vocab_size})")
        if options.dimensions > self.output_dim:
            raise InputError(f"parameter 'dimensions' is {options.dimensions}; the model has {self.output_dim}")
        bounds = np.concatenate([[0], np.cumsum(seq_lens)])
        ids = input_ids.astype(np.int64, copy=False)
        return [ids[bounds[i]:bounds[i + 1]] for i in range(seq_lens.size)]

    def submit(self, input_ids: np.ndarray, seq_lens: np.ndarray, options: RequestOptions,
               on_done: DoneCallback) -> int:
        """Queue one request; raises InputError/OverloadError before queuing anything."""
        sequences = self.validate(input_ids, seq_lens, options)
        num_tokens = int(seq_lens.sum())
        with self._lock:
            if self._closing:
                raise OverloadError("the encoder is shutting down")
            if self._batcher.queued_tokens + num_tokens > self.max_queued_tokens and len(self._batcher):
                raise OverloadError(f"encoder queue is full ({self._batcher.queued_tokens} tokens queued, "
                                    f"limit {self.max_queued_tokens}); retry later")
            key = next(self._ids)
            rows = np.empty((len(sequences), self.output_dim), dtype=np.float32)
            self._requests[key] = _PooledRequest(sequences, options, on_done, rows, len(sequences))
            self._batcher.add(key, (len(s) for s in sequences))
            self._lock.notify()
        return key

    def close(self, timeout: float = 60.0) -> None:
        """Stop accepting work, finish everything queued and in flight."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._scheduler.join(timeout)
        self._completer.join(timeout)

    def _schedule_loop(self) -> None:
        while True:
            with self._lock:
                while not len(self._batcher) and not self._closing:
                    self._lock.wait()
                if not len(self._batcher):
                    break  # closing and drained
                scheduled = self._batcher.next_batch()
                sequences = [self._requests[s.request_key].sequences[s.index] for s in scheduled]
            self._inflight.acquire()
            try:
                lazy = self.engine.step(PackedBatch.from_sequences(sequences))
            except Exception as exc:  # a failed step fails its requests, not the service
                log.exception("engine step failed")
                self._inflight.release()
                self._fail(scheduled, exc)
                continue
            self._launched.put((scheduled, lazy))
        self._launched.put(None)

    def _complete_loop(self) -> None:
        while (item := self._launched.get()) is not None:
            scheduled, lazy = item
            try:
                rows = lazy.wait()
            except Exception as exc:
                log.exception("waiting on a batch failed")
                self._fail(scheduled, exc)
                continue
            finally:
                self._inflight.release()
            self._record(scheduled)
            for seq, row in zip(scheduled, rows):
                self._deliver(seq, row)

    def _record(self, scheduled: list[ScheduledSequence]) -> None:
        tokens = sum(s.num_tokens for s in scheduled)
        self.stats.batches += 1
        self.stats.sequences += len(scheduled)
        self.stats.tokens += tokens

    def _deliver(self, seq: ScheduledSequence, row: np.ndarray) -> None:
        request = self._requests.get(seq.request_key)
        if request is None or request.finished:
            return
        request.rows[seq.index] = row
        request.remaining -= 1
        if request.remaining == 0:
            self._finish(seq.request_key, request, None)

    def _fail(self, scheduled: list[ScheduledSequence], exc: Exception) -> None:
        for key in {s.request_key for s in scheduled}:
            request = self._requests.get(key)
            if request is not None and not request.finished:
                with self._lock:
                    self._batcher.drop(key)
                self._finish(key, request, RuntimeError(f"inference failed: {exc}"))

    def _finish(self, key: int, request: _PooledRequest, error: Optional[Exception]) -> None:
        request.finished = True
        with self._lock:
            self._requests.pop(key, None)
        if error is not None:
            self.stats.requests_failed += 1
            result = None
        else:
            self.stats.requests_done += 1
            result = request.rows
            if request.options.dimensions:
                result = result[:, :request.options.dimensions]
            if request.options.normalize:
                result = normalize_rows(result)
            result = np.ascontiguousarray(result, dtype=np.float32)
        try:
            request.on_done(result, error)
        except Exception:
            log.exception("response callback failed")


def build_service(config) -> EncoderService:
    """EncoderService from an EncoderConfig (the encoder model's one-call setup)."""
    import torch

    from .config import resolve_model_dir
    from .engine import Engine

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    engine = Engine(resolve_model_dir(config.model_dir), device=config.device, dtype=config.dtype,
                    attention_backend=config.attention_backend)
    return EncoderService(engine, config.max_batch_tokens, config.max_batch_sequences,
                          config.max_inflight_batches, config.max_queued_tokens)

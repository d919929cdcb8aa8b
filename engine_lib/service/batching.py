"""BatchingService: request pool -> token-budget batches (two priority classes) -> engine.step -> responses.

Two threads. The scheduler thread waits for a launch slot, then pops a batch
from the PriorityBatcher and launches it (`engine.step` returns a LazyTensor at
once); at most `max_inflight_batches` are in flight, so batch N+1 is prepared
and launched while batch N runs. The completion thread waits on LazyTensors in launch
order, scatters rows into their requests and calls each request's `on_done`
exactly once, when all its sequences are done (or with an error). No request
is dropped silently: a step whose rows do not match its sequences fails those
requests, and if `on_done` raises on a result it is called once more, with
the error. A result
that is ready at launch (CPU) is answered by the scheduler thread itself when
the completion thread has nothing pending: one thread hand-off less per batch.
Admission control bounds the pool (requests pending, tokens queued): past a
bound `submit` raises OverloadError at once. Requests arrive validated and
leave as raw pooled rows (engine_lib/service/endpoint.py does both ends). A request's
token ids stay flat; each batch gathers its sequences' slices of them once (`gather`). A cancelled request's sequences
are dropped when they come up for launch. docs/operations.md has the limits.

Fatal failures: if either thread dies, or a step reports a sticky device error
(the CUDA context is unusable from then on), the service answers every pending
request with an error, refuses new ones and calls `on_fatal(reason)`; the
default (engine_lib/service/fatal.py) exits the process so the launcher's watchdog
restarts the server (never "ready" while hanging requests).

Test-only hold (engine_lib/faults.py, point ENCODER_BATCH): while a test holds it the
scheduler picks no batch; queued requests stay queued (and are still checked for
cancellation), so tests can keep work in flight on any machine. Off: one global test per pick.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from engine_lib import faults
from engine_lib.contract import Engine, PackedBatch, RaggedTokens
from engine_lib.errors import DeviceOutOfMemory, OverloadError, RequestCancelled
from engine_lib.runner.compute_thread import ComputeThread
from engine_lib.service.fatal import exit_process, is_sticky_device_error
from engine_lib.service.metrics import EncoderMetrics
from engine_lib.service.scheduler import INTERACTIVE, PRIORITIES, PriorityBatcher, ScheduledSequence

log = logging.getLogger(__name__)

DoneCallback = Callable[[Optional[np.ndarray], Optional[Exception]], None]


OUT_OF_MEMORY = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "can't allocate memory")  # CUDA, cuBLAS, CPU


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA and CPU allocators (and cuBLAS) say so in their message; numpy raises MemoryError."""
    return isinstance(exc, MemoryError) or any(marker in str(exc) for marker in OUT_OF_MEMORY)


@dataclass
class _PooledRequest:
    tokens: RaggedTokens  # validated (endpoint.py); its sequences are never split
    on_done: DoneCallback
    rows: np.ndarray
    remaining: int
    is_cancelled: Optional[Callable[[], bool]] = None
    priority: str = INTERACTIVE
    checked_at: float = 0.0  # last cancellation check (or arrival), time.monotonic()
    finished: bool = False
    # Hop timestamps (time.perf_counter): received by the adapter, first sequence
    # picked into a batch, last launched, last result on the host.
    received: float = 0.0
    picked: float = 0.0
    launched: float = 0.0
    ready: float = 0.0
    # Traces on and the request in one (engine_lib/tracing.py): called with (request, sent_at) once
    # answered; `batch` then holds its last batch's (sequences, tokens).
    trace: Optional[Callable[["_PooledRequest", float], None]] = None
    batch: tuple[int, int] = (0, 0)


def gather(scheduled: list[ScheduledSequence], requests: list[_PooledRequest]) -> PackedBatch:
    """The scheduled sequences as one PackedBatch: their slices of the requests' flat ids, copied once.

    A request's sequences leave in order, so those in one batch are contiguous in its ids and
    adjacent (but for a promoted batch-class head, scheduler.py): one slice per run of them
    (taken as is when it is the only one).
    """
    runs: list[tuple[_PooledRequest, int, int]] = []  # (request, start, stop) in its flat ids
    for seq, request in zip(scheduled, requests):
        if runs and runs[-1][0] is request and runs[-1][2] == seq.start:
            runs[-1] = (request, runs[-1][1], seq.start + seq.num_tokens)
        else:
            runs.append((request, seq.start, seq.start + seq.num_tokens))
    input_ids = _join([r.tokens.input_ids[a:b] for r, a, b in runs])
    token_types = None
    if any(r.tokens.token_types is not None for r, _, _ in runs):
        token_types = _join([np.zeros(b - a, dtype=np.int64) if r.tokens.token_types is None
                             else r.tokens.token_types[a:b] for r, a, b in runs])
    queries = np.fromiter((getattr(r.tokens.options, "input_type", "") == "query" for r in requests),
                          dtype=bool, count=len(requests))
    return PackedBatch.from_flat(input_ids, [s.num_tokens for s in scheduled], token_types,
                                 queries if queries.any() else None)


def _join(slices: list[np.ndarray]) -> np.ndarray:
    return slices[0] if len(slices) == 1 else np.concatenate(slices)


class BatchingService:
    def __init__(self, engine: Engine, max_batch_tokens: int, max_batch_sequences: int,
                 max_inflight_batches: int = 2, max_queued_tokens: int = 1 << 20,
                 max_queued_requests: int = 2048, metrics: Optional[EncoderMetrics] = None,
                 cancel_check_interval: float = 0.05, on_fatal: Callable[[str], None] = exit_process,
                 batch_promote_s: float = 1.0, max_batch_class_tokens: Optional[int] = None,
                 max_backfill_tokens: Optional[int] = None, scheduler_thread: Optional[ComputeThread] = None):
        self.engine = engine
        self.max_batch_tokens = max_batch_tokens
        self.failure: Optional[str] = None  # set once, when the service has failed for good
        self._on_fatal = on_fatal
        self.output_dim = engine.output_dim
        self.max_queued_tokens = max_queued_tokens
        self.max_queued_requests = max_queued_requests
        # A check is one IPC round trip in Triton's Python backend (~50 us here):
        # a request is checked only once it has waited this long, then at most
        # this often, so short waits under light load cost nothing.
        self.cancel_check_interval = cancel_check_interval
        self.metrics = metrics or EncoderMetrics()
        self._batcher = PriorityBatcher(max_batch_tokens, max_batch_sequences, batch_promote_s,
                                        max_batch_class_tokens=max_batch_class_tokens,
                                        max_backfill_tokens=max_backfill_tokens)
        self.max_backfill_tokens = self._batcher.max_backfill_tokens  # as resolved (default: the class budget)
        self.max_inflight_batches = max_inflight_batches
        self._requests: dict[int, _PooledRequest] = {}
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._closing = False
        self._inflight = threading.Semaphore(max_inflight_batches)
        self._launched: queue.Queue = queue.Queue()
        # Batches given to the completion thread and not yet answered (under _lock): while
        # any are, results are answered there, so one thread at a time delivers rows.
        self._handed_off = 0
        self._completer = threading.Thread(target=self._guarded, args=(self._complete_loop,),
                                           name="rose-completion", daemon=True)
        self._completer.start()
        # The steps run on the scheduler's thread: the one that loaded the engine when given
        # (runner/compute_thread.py says why), else a thread of the service's own.
        self._scheduler = scheduler_thread or ComputeThread("rose-scheduler")
        self._scheduler.hand_over(lambda: self._guarded(self._schedule_loop))

    def submit(self, tokens: RaggedTokens, on_done: DoneCallback,
               is_cancelled: Optional[Callable[[], bool]] = None, received_at: Optional[float] = None,
               priority: str = INTERACTIVE, trace: Optional[Callable] = None) -> int:
        """Queue one request's `tokens` (already validated, see endpoint.py) in the scheduling class
        `priority` (interactive or batch); raises OverloadError before queuing anything.
        `on_done(rows, error)` gets the raw rows [num_seqs, engine.output_dim] in order.

        `is_cancelled` is polled when the request's sequences are about to launch
        (see cancel_check_interval); once it says True, the still-queued
        sequences are dropped and `on_done` gets a RequestCancelled error. `received_at`
        (time.perf_counter) starts the request's hop timing (rose_hop_seconds_total).
        """
        num_tokens, lengths = len(tokens.input_ids), tokens.lengths
        with self._lock:
            refusal = self._refusal(num_tokens)
            if refusal is not None:
                reason, message = refusal
                self.metrics.count("rose_refused_total", reason=reason)
                raise OverloadError(message)
            key = next(self._ids)
            rows = np.empty((len(lengths), self.output_dim), dtype=getattr(self.engine, "row_dtype", np.float32))
            self._requests[key] = _PooledRequest(tokens, on_done, rows, len(lengths), is_cancelled, priority,
                                                 time.monotonic(), received=received_at or time.perf_counter(),
                                                 trace=trace)
            self._batcher.add(key, lengths, priority)
            self._lock.notify()
        return key

    def _refusal(self, num_tokens: int) -> Optional[tuple[str, str]]:
        """(reason, message) if admission control refuses a request of `num_tokens` now."""
        if self.failure is not None:
            return "shutting_down", f"the encoder has failed ({self.failure}) and is restarting; retry"
        if self._closing:
            return "shutting_down", "the encoder is shutting down; retry on another replica"
        if len(self._requests) >= self.max_queued_requests:
            return "queue_requests", (f"encoder queue is full ({len(self._requests)} requests pending, "
                                      f"limit max_queued_requests={self.max_queued_requests}); retry later")
        if self._batcher.queued_tokens + num_tokens > self.max_queued_tokens:
            return "queue_tokens", (f"encoder queue is full ({self._batcher.queued_tokens} tokens queued "
                                    f"+ {num_tokens} asked, limit max_queued_tokens={self.max_queued_tokens}); "
                                    f"retry later")
        return None

    def queue_depth(self) -> dict[str, float]:
        """Gauges: requests accepted and not yet answered, tokens not yet launched."""
        with self._lock:
            return {"rose_queue_requests": len(self._requests),
                    "rose_queue_tokens": self._batcher.queued_tokens}

    def class_depth(self) -> dict[str, int]:
        """Sequences queued (not yet launched) by priority class."""
        with self._lock:
            return {p: self._batcher.depth(p) for p in PRIORITIES}

    def close(self, timeout: float = 60.0) -> None:
        """Stop accepting work, finish everything queued and in flight."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._scheduler.join(timeout)
        self._completer.join(timeout)

    def _schedule_loop(self) -> None:
        while True:
            # A launch slot first, then the batch: requests keep joining the
            # queue while every slot is busy, so the next batch is as full as
            # the device's pace allows instead of frozen at one sequence.
            self._inflight.acquire()
            with self._lock:
                while not self._closing and (not len(self._batcher) or (faults.hook is not None and self._held())):
                    self._lock.wait(0.01 if len(self._batcher) else None)  # held: look again soon
                if not len(self._batcher):
                    break  # closing and drained
                promoted = self._batcher.promoted
                scheduled = self._batcher.next_batch()
                promoted = self._batcher.promoted - promoted
            if promoted:
                self.metrics.count("rose_promoted_sequences_total", promoted)
            self._launch(scheduled, time.perf_counter())
        self._inflight.release()
        self._launched.put(None)

    def _held(self) -> bool:
        """Test-only hold (called under _lock with work queued): True while a test holds ENCODER_BATCH;
        queued requests whose client has gone are answered meanwhile, as at launch."""
        if not faults.held(faults.ENCODER_BATCH):
            return False
        self._drop_cancelled(self._batcher.queued(), popped=False)
        return True

    def _launch(self, scheduled: list[ScheduledSequence], picked_at: float) -> None:
        """Step one picked batch (holding a launch slot) and answer it or hand it to the completion thread."""
        scheduled = self._drop_cancelled(scheduled)
        with self._lock:  # a failure on the completion thread may have answered some already
            scheduled = [s for s in scheduled if s.request_key in self._requests]
            requests = [self._requests[s.request_key] for s in scheduled]
        if not scheduled:
            self._inflight.release()
            return
        batch = gather(scheduled, requests)
        launched_at = time.perf_counter()
        for request in requests:
            request.picked = request.picked or picked_at
            request.launched = launched_at
            if request.trace is not None:
                request.batch = (batch.num_seqs, len(batch.input_ids))
        try:
            lazy = self.engine.step(batch)
        except Exception as exc:  # a failed step fails its requests, not the service
            log.exception("engine step failed")
            self._inflight.release()
            self._fail(scheduled, exc)
            if is_sticky_device_error(exc):
                raise
            return
        with self._lock:
            inline = self._handed_off == 0 and lazy.ready()
            self._handed_off += not inline
        if inline:  # already on the host (CPU): answer here, no hand-off to the completion thread
            self._complete(scheduled, lazy, launched_at)
        else:
            self._launched.put((scheduled, lazy, launched_at))

    def _guarded(self, loop: Callable[[], None]) -> None:
        """Run a service thread's loop; if it ends by an exception, the service fails for good."""
        try:
            loop()
        except BaseException as exc:
            self._die(f"{threading.current_thread().name} thread died: {exc!r}")

    def _die(self, reason: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = reason
            self._closing = True
            pending = list(self._requests.items())
            self._lock.notify_all()
        log.critical("encoder failed: %s; answering %d pending request(s) with an error and exiting so the "
                     "launcher restarts the server", reason, len(pending))
        for key, request in pending:
            self._finish(key, request, RuntimeError(f"the encoder failed and is restarting: {reason}"))
        self._on_fatal(reason)

    def _drop_cancelled(self, scheduled: list[ScheduledSequence], popped: bool = True) -> list[ScheduledSequence]:
        """Drop sequences of requests whose client has gone; answer those requests. `popped`:
        `scheduled` left the batcher (a batch at launch), else they are still queued (the hold)."""
        cancelled = []
        with self._lock:
            requests = {s.request_key: self._requests.get(s.request_key) for s in scheduled}
        now = time.monotonic()
        for key, request in requests.items():
            if request is None or request.is_cancelled is None:
                continue
            if now - request.checked_at < self.cancel_check_interval:
                continue
            request.checked_at = now
            try:
                if request.is_cancelled():
                    cancelled.append(key)
            except Exception:  # cannot tell: keep serving the request
                log.exception("checking cancellation failed")
        if not cancelled:
            return scheduled
        num_dropped = sum(s.request_key in cancelled for s in scheduled) if popped else 0
        with self._lock:
            num_dropped += sum(self._batcher.drop(key) for key in cancelled)
        self.metrics.count("rose_cancelled_sequences_total", num_dropped)
        for key in cancelled:
            self._finish(key, requests[key], RequestCancelled("request cancelled by the client"))
        return [s for s in scheduled if s.request_key not in cancelled]

    def _complete_loop(self) -> None:
        while (item := self._launched.get()) is not None:
            try:
                self._complete(*item)
            finally:
                with self._lock:
                    self._handed_off -= 1

    def _complete(self, scheduled: list[ScheduledSequence], lazy, launched_at: float) -> None:
        try:
            rows = lazy.wait()
        except Exception as exc:
            log.exception("waiting on a batch failed")
            self._fail(scheduled, exc)
            if is_sticky_device_error(exc):
                raise
            return
        finally:
            self._inflight.release()
        shape = np.shape(rows)
        if shape != (len(scheduled), self.output_dim):  # never zip short: every request is answered
            log.error("engine step returned rows of shape %s for %d sequences", shape, len(scheduled))
            self._fail(scheduled, RuntimeError(f"the engine returned rows of shape {list(shape)} for "
                                               f"{len(scheduled)} sequences of width {self.output_dim}"))
            return
        ready_at = time.perf_counter()
        self._record(scheduled, ready_at - launched_at)
        for seq, row in zip(scheduled, rows):
            self._deliver(seq, row, ready_at)

    def _record(self, scheduled: list[ScheduledSequence], seconds: float) -> None:
        by_class = dict.fromkeys(PRIORITIES, 0)
        for s in scheduled:
            by_class[s.priority] += s.num_tokens
        self.metrics.count_each("rose_priority_tokens_total", "priority", by_class)
        self.metrics.observe("rose_step_tokens", sum(by_class.values()))
        self.metrics.observe("rose_step_sequences", len(scheduled))
        self.metrics.observe("rose_step_seconds", seconds)

    def _deliver(self, seq: ScheduledSequence, row: np.ndarray, ready_at: float) -> None:
        request = self._requests.get(seq.request_key)
        if request is None or request.finished:
            return
        request.rows[seq.index] = row
        request.ready = ready_at
        request.remaining -= 1
        if request.remaining == 0:
            self._finish(seq.request_key, request, None)

    def _fail(self, scheduled: list[ScheduledSequence], exc: Exception) -> None:
        error = RuntimeError(f"inference failed: {exc}")
        if is_out_of_memory(exc):
            error = DeviceOutOfMemory(
                f"the device ran out of memory on a batch of {sum(s.num_tokens for s in scheduled)} tokens in "
                f"{len(scheduled)} sequence{'' if len(scheduled) == 1 else 's'}; retry, or send fewer or shorter "
                f"texts (a batch holds at most "
                f"max_batch_tokens={self.max_batch_tokens} tokens; a longer sequence runs alone)")
        for key in {s.request_key for s in scheduled}:
            request = self._requests.get(key)
            if request is not None:
                with self._lock:
                    self._batcher.drop(key)
                self._finish(key, request, error)

    def _finish(self, key: int, request: _PooledRequest, error: Optional[Exception]) -> None:
        # Cancellation (scheduler thread) can race completion or failure
        # (completion thread): whoever sets `finished` first answers, once.
        with self._lock:
            if request.finished:
                return
            request.finished = True
            self._requests.pop(key, None)
        if error is None:
            try:
                request.on_done(request.rows, None)
            except Exception as exc:  # e.g. building the response failed: answer with an error instead
                log.exception("response callback failed; answering the request with an error")
                error = RuntimeError(f"sending the result failed: {exc!r}")
            else:
                self.metrics.count("rose_requests_total", outcome="ok")
                self._record_hops(request, time.perf_counter())
                return
        self.metrics.count("rose_requests_total",
                           outcome="cancelled" if isinstance(error, RequestCancelled) else "error")
        try:
            request.on_done(None, error)
        except Exception:
            log.exception("response callback failed on an error answer: the request got no answer")

    def _record_hops(self, r: _PooledRequest, sent_at: float) -> None:
        self.metrics.count_each("rose_hop_seconds_total", "hop", {
            "wait": r.picked - r.received, "form": r.launched - r.picked,
            "compute": r.ready - r.launched, "respond": sent_at - r.ready})
        self.metrics.observe("rose_wait_seconds", r.picked - r.received, priority=r.priority)
        if r.trace is not None:
            try:
                r.trace(r, sent_at)
            except Exception:  # a trace is never worth a request or the service
                log.exception("writing the request's trace spans failed")


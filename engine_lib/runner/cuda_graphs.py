"""Lazily captured whole-model CUDA graphs per (sequence-count bucket, token bucket[, max_seqlen bucket]).

Bookkeeping is plain Python: `GraphBuckets` maps a batch to its bucket,
`LazyGraphCache` decides eager / capture / replay (first hit eager, second hit
capture, later hits replay). `GraphRunner` owns the static device buffers,
pads each batch into them (runner/inputs.py: a padded batch has exactly the
bucket's token and sequence counts) and calls an injected
`capture(fn) -> (replay, output)`: `CudaGraphCapture` on a GPU, a stand-in in CPU tests.

Backends whose kernel launch is sized by max_seqlen (varlen) key graphs by a
max_seqlen bucket too (powers of two from 64, capped by the model's maximum
and the token bucket), so a graph never launches blocks for thousands of empty
rows. A bucket whose plan or capture fails runs eagerly from then on.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Callable, Hashable

from engine_lib.contract import PackedBatch
from engine_lib.runner.inputs import step_inputs

log = logging.getLogger(__name__)

EAGER, CAPTURE, REPLAY = "eager", "capture", "replay"


def token_buckets(max_tokens: int, small_step: int = 64, large_step: int = 256, threshold: int = 1024) -> list[int]:
    """Multiples of `small_step` up to `threshold`, then of `large_step`, up to max_tokens."""
    if max_tokens < small_step or threshold % small_step or large_step % small_step:
        raise ValueError(f"bad token buckets: max {max_tokens}, steps {small_step}/{large_step}, threshold {threshold}")
    buckets = list(range(small_step, min(threshold, max_tokens) + 1, small_step))
    buckets += list(range(threshold + large_step, max_tokens + 1, large_step))
    if buckets[-1] != max_tokens and max_tokens % small_step == 0:
        buckets.append(max_tokens)
    return buckets


def seq_buckets(max_seqs: int) -> list[int]:
    """Powers of two up to max_seqs, and max_seqs itself."""
    buckets = [1 << i for i in range(max_seqs.bit_length()) if 1 << i <= max_seqs]
    return buckets if buckets[-1] == max_seqs else buckets + [max_seqs]


def seqlen_bucket(max_seqlen: int, cap: int, smallest: int = 64) -> int:
    """The power of two (>= smallest) that holds max_seqlen, at most `cap` (cap >= max_seqlen)."""
    return min(max(smallest, 1 << (max(max_seqlen, 1) - 1).bit_length()), cap)


class GraphBuckets:
    """Batch geometry -> graph key (num_seqs_bucket, num_tokens_bucket[, max_seqlen_bucket]), or None for eager.

    `max_seqlen_cap` (the model's maximum sequence length) turns on the max_seqlen bucket.
    """

    def __init__(self, max_tokens: int, max_seqs: int, small_step: int = 64, large_step: int = 256,
                 threshold: int = 1024, max_seqlen_cap: int | None = None):
        max_tokens = -(-max_tokens // small_step) * small_step
        self.token_buckets = token_buckets(max_tokens, small_step, large_step, threshold)
        self.seq_buckets = seq_buckets(max_seqs)
        self.max_seqlen_cap = max_seqlen_cap
        self.max_tokens, self.max_seqs = self.token_buckets[-1], self.seq_buckets[-1]
        self._step = small_step
        # Precomputed: ceil(num_tokens / small_step) -> token bucket.
        self._token_map = [self.token_buckets[bisect.bisect_left(self.token_buckets, i * small_step)]
                           for i in range(self.max_tokens // small_step + 1)]

    def key(self, num_seqs: int, num_tokens: int, max_seqlen: int | None = None) -> tuple[int, ...] | None:
        if num_tokens > self.max_tokens or num_seqs > self.max_seqs or num_seqs < 1:
            return None
        seqs = self.seq_buckets[bisect.bisect_left(self.seq_buckets, num_seqs)]
        tokens = self._token_map[-(-num_tokens // self._step)]
        if self.max_seqlen_cap is None:
            return seqs, tokens
        cap = min(tokens, max(self.max_seqlen_cap, max_seqlen or 1))
        return seqs, tokens, seqlen_bucket(max_seqlen or num_tokens, cap, self._step)

    def covers(self, max_batch_tokens: int, max_batch_seqs: int) -> bool:
        """True when every batch of at most these sizes has a bucket."""
        return self.max_tokens >= max_batch_tokens and self.max_seqs >= max_batch_seqs


@dataclass
class GraphStats:
    """Every step is exactly one of: eager run, capture (then replayed once), replay."""
    eager_runs: int = 0
    captures: int = 0
    replays: int = 0
    capture_failures: int = 0  # plan or capture failures: that bucket runs eagerly from then on
    graphs: int = 0


class LazyGraphCache:
    """First hit of a key -> EAGER, second -> CAPTURE, later -> REPLAY (at most max_graphs kept)."""

    def __init__(self, max_graphs: int | None = None):
        self.max_graphs = max_graphs
        self._seen: set[Hashable] = set()
        self._failed: set[Hashable] = set()
        self._graphs: dict[Hashable, object] = {}

    def __len__(self) -> int:
        return len(self._graphs)

    def action(self, key: Hashable) -> str:
        if key in self._graphs:
            return REPLAY
        full = self.max_graphs is not None and len(self._graphs) >= self.max_graphs
        if key in self._seen and key not in self._failed and not full:
            return CAPTURE
        self._seen.add(key)
        return EAGER

    def store(self, key: Hashable, graph: object) -> None:
        self._graphs[key] = graph

    def get(self, key: Hashable) -> object:
        return self._graphs[key]

    def mark_failed(self, key: Hashable) -> None:
        """A key whose plan or capture failed runs eagerly from now on."""
        self._failed.add(key)

    def failed(self, key: Hashable) -> bool:
        return key in self._failed


Capture = Callable[[Callable[[], object]], tuple[Callable[[], None], object]]


class GraphRunner:
    """Runs padded batches through lazily captured graphs over static buffers.

    `forward(token_data, cu_seqlens, plan)` maps static views to a pooled
    [num_seqs_bucket, hidden] tensor; it must not sync with the host.
    """

    def __init__(self, forward: Callable, backend, buckets: GraphBuckets, device, capture: Capture,
                 stats: GraphStats | None = None, max_graphs: int | None = None):
        import torch

        self._torch = torch
        self.forward, self.backend, self.buckets, self.device = forward, backend, buckets, device
        self.capture = capture
        self.stats = stats or GraphStats()
        self.cache = LazyGraphCache(max_graphs)
        self._plans: dict[tuple[int, int], object] = {}
        self._token_data = torch.zeros((4, buckets.max_tokens), dtype=torch.int64, device=device)
        self._cu_seqlens = torch.zeros(buckets.max_seqs + 1, dtype=torch.int32, device=device)

    def run(self, batch: PackedBatch):
        """Pooled [num_seqs, hidden] for the batch, or None: above the largest bucket, or its bucket failed."""
        key = self.buckets.key(batch.num_seqs, batch.num_tokens, batch.max_seqlen)
        if key is None or self.cache.failed(key):
            return None
        num_seqs, num_tokens = key[:2]
        static = self._token_data[:, :num_tokens], self._cu_seqlens[:num_seqs + 1]
        inputs = step_inputs(batch, self.device, pad_to=(num_seqs, num_tokens), out=static)
        try:
            if key not in self._plans:
                self._plans[key] = self.backend.graph_plan(num_seqs, num_tokens, self.device, key[-1])
            plan = self._plans[key]
            self.backend.update_graph_plan(plan, inputs.host.cu_seqlens)
        except Exception:  # a plan is host work: nothing was recorded, the eager path is clean
            self._give_up(key, "planning")
            return None
        step = lambda: self.forward(inputs.token_data, inputs.cu_seqlens, plan)
        action = self.cache.action(key)
        if action == CAPTURE:
            output = self._capture(key, step)
            if output is None:
                return None
        elif action == EAGER:
            self.stats.eager_runs += 1
            output = step()
        else:
            replay, output = self.cache.get(key)
            replay()
            self.stats.replays += 1
        # A copy: the static output is overwritten by the next replay while this one may still be read.
        return output[:batch.num_seqs].clone()

    def _give_up(self, key, what: str) -> None:
        log.exception("CUDA graph %s failed for bucket %s; that bucket runs eagerly from now on", what, key)
        self.cache.mark_failed(key)
        self._plans.pop(key, None)
        self.stats.capture_failures += 1

    def _capture(self, key, step):
        try:
            replay, output = self.capture(step)
        except Exception:
            self._give_up(key, "capture")
            return None
        self.cache.store(key, (replay, output))
        self.stats.captures += 1
        self.stats.graphs = len(self.cache)
        replay()  # capture records work without running it
        return output


class CudaGraphCapture:
    """Real capture: one side stream and one memory pool shared by every graph.

    Sharing the pool is safe because replays run in stream order on one stream
    and each graph's output is copied out before the next replay.
    """

    def __init__(self, device):
        import torch

        self._torch = torch
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, fn):
        torch = self._torch
        caller = torch.cuda.current_stream()
        try:
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                fn()  # warm-up on the capture stream (lazy per-stream library state)
            caller.wait_stream(self.stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the completion thread may query events while the scheduler thread captures.
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                output = fn()
            return graph.replay, output
        except Exception:
            # torch.cuda.graph's exit skips restoring the stream when capture_end raises, and the
            # side stream may be left capturing: restore the caller's stream, use a fresh side stream.
            torch.cuda.set_stream(caller)
            self.stream = torch.cuda.Stream(self.stream.device)
            raise
        finally:
            if torch.cuda.current_stream() != caller:
                torch.cuda.set_stream(caller)

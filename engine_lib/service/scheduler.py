"""Batching of sequences under a token budget, in two priority classes.

Pure Python (no torch, no numpy): it sees only request keys, sequence lengths
(and where each sequence starts in its request's flat ids, for the service to
gather), each request's class, and the time through an injected `clock`.

Order: interactive sequences first, then batch sequences, first come first
served within each class; each batch is the longest prefix of that order that
fits the budget and the sequence cap. Promotion: once batches have been
formed without any of the queued batch work for longer than `batch_promote_s`
(interactive work filled them), the head of the batch queue leaves first in the
next batch, so batch work never starves: at least one of its sequences leaves
per `batch_promote_s`, and whenever interactive work leaves room, batch work
fills it (then nothing is promoted, however long batch requests have queued).
Batch-class budget: a batch carries at most `max_batch_class_tokens` tokens of batch-class work
(default: the whole budget), and a batch that carries interactive work at most
`max_backfill_tokens` of it (default: the batch-class budget). On a CPU a step's time grows with
every token, and a step, once formed, is never pre-empted: a smaller batch-class budget keeps the
steps an interactive request waits behind short, at no cost to bulk throughput past saturation; a
smaller backfill keeps its own step as short as if no batch work were queued, at the cost of the
batch class's share of the steps while interactive work keeps arriving.
Invariants: a sequence is never split; a sequence longer than the budget leaves
alone; otherwise a batch never exceeds the budget or the cap; within a class,
sequences leave in arrival order; the first of the order always leaves in the
next batch; a batch's batch-class tokens stay within `max_batch_class_tokens` (within
`max_backfill_tokens` when it carries interactive work) but for a batch-class sequence longer than
it, which leaves alone, and for a promoted sequence. With one class in the queue this is plain FCFS.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

from engine_lib.options import BATCH, INTERACTIVE, PRIORITIES  # noqa: F401 (PRIORITIES: re-exported)


CPU_BATCH_CLASS_TOKENS = 256  # max_batch_class_tokens=auto on a CPU (past 64-128 tokens a step buys no throughput there)
CPU_BACKFILL_TOKENS = 0  # max_backfill_tokens=auto on a CPU: an interactive step runs as long as it would alone


def batch_class_budget(setting: int, max_batch_tokens: int, on_cpu: bool) -> int:
    """max_batch_class_tokens: `setting` (auto < 1: CPU_BATCH_CLASS_TOKENS on a CPU, else the whole
    budget), never above `max_batch_tokens`."""
    if setting < 1:
        setting = CPU_BATCH_CLASS_TOKENS if on_cpu else max_batch_tokens
    return min(setting, max_batch_tokens)


def backfill_budget(setting: int, batch_class_tokens: int, on_cpu: bool) -> int:
    """max_backfill_tokens: `setting` (auto < 0: CPU_BACKFILL_TOKENS on a CPU, else the batch-class
    budget), never above `batch_class_tokens`."""
    if setting < 0:
        setting = CPU_BACKFILL_TOKENS if on_cpu else batch_class_tokens
    return min(setting, batch_class_tokens)


@dataclass(frozen=True)
class ScheduledSequence:
    request_key: Hashable
    index: int  # position of the sequence inside its request
    num_tokens: int
    start: int  # offset of its first token in the request's flat ids
    priority: str = INTERACTIVE


class PriorityBatcher:
    def __init__(self, max_batch_tokens: int, max_batch_sequences: int, batch_promote_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, max_batch_class_tokens: int | None = None,
                 max_backfill_tokens: int | None = None):
        if max_batch_class_tokens is None:
            max_batch_class_tokens = max_batch_tokens
        if max_backfill_tokens is None:
            max_backfill_tokens = max_batch_class_tokens
        if max_backfill_tokens < 0:
            raise ValueError(f"max_backfill_tokens must be >= 0, got {max_backfill_tokens}")
        if max_batch_tokens < 1 or max_batch_sequences < 1 or max_batch_class_tokens < 1:
            raise ValueError("max_batch_tokens, max_batch_sequences and max_batch_class_tokens must be >= 1")
        if not batch_promote_s > 0:
            raise ValueError(f"batch_promote_s must be > 0, got {batch_promote_s}")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_sequences = max_batch_sequences
        self.max_batch_class_tokens = min(max_batch_class_tokens, max_batch_tokens)
        self.max_backfill_tokens = min(max_backfill_tokens, self.max_batch_class_tokens)
        self.batch_promote_s = batch_promote_s
        self._clock = clock
        self._queues: dict[str, deque[ScheduledSequence]] = {p: deque() for p in PRIORITIES}
        self.tokens = dict.fromkeys(PRIORITIES, 0)  # queued tokens by class
        self.queued_tokens = 0
        self.promoted = 0  # batch sequences that left by promotion, ever (a counter for metrics)
        self._passed_over_since: float | None = None  # first batch formed without the queued batch work

    def __len__(self) -> int:
        return len(self._queues[INTERACTIVE]) + len(self._queues[BATCH])

    def depth(self, priority: str) -> int:
        """Sequences of class `priority` queued."""
        return len(self._queues[priority])

    def add(self, request_key: Hashable, seq_lens: Iterable[int], priority: str = INTERACTIVE) -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        added, start = [], 0
        for index, num_tokens in enumerate(seq_lens):
            if num_tokens < 1:
                raise ValueError(f"sequence {index} of {request_key!r} has {num_tokens} tokens")
            added.append(ScheduledSequence(request_key, index, int(num_tokens), start, priority))
            start += int(num_tokens)
        self._queues[priority].extend(added)
        self.tokens[priority] += start
        self.queued_tokens += start

    def next_batch(self) -> list[ScheduledSequence]:
        """Pop the longest prefix of the order (promoted batch head, interactive, batch) that fits the
        budget, the sequence cap and the batch-class budget (the backfill budget behind interactive work)."""
        interactive, batch_queue = self._queues[INTERACTIVE], self._queues[BATCH]
        now = self._clock()
        promote = bool(interactive and batch_queue and self._passed_over_since is not None
                       and now - self._passed_over_since > self.batch_promote_s)
        batch = [batch_queue.popleft()] if promote else []
        batch_tokens = batch_class_tokens = batch[0].num_tokens if promote else 0
        for queue in (interactive, batch_queue):
            backfill = queue is batch_queue and len(batch) > promote  # behind interactive work
            class_budget = self.max_backfill_tokens if backfill else self.max_batch_class_tokens
            while queue and len(batch) < self.max_batch_sequences:
                head = queue[0]
                class_tokens = batch_class_tokens + head.num_tokens if head.priority == BATCH else 0
                if batch and (batch_tokens + head.num_tokens > self.max_batch_tokens
                              or class_tokens > class_budget):
                    break
                batch.append(queue.popleft())
                batch_tokens += head.num_tokens
                if head.priority == BATCH:
                    batch_class_tokens = class_tokens
            if queue:  # the next of the order did not fit: nothing behind it jumps ahead
                break
        took_batch_work = promote or bool(batch) and batch[-1].priority == BATCH
        for seq in batch:
            self.tokens[seq.priority] -= seq.num_tokens
        self.queued_tokens -= batch_tokens
        self.promoted += bool(promote)
        if took_batch_work or not batch_queue:
            self._passed_over_since = None
        elif self._passed_over_since is None:
            self._passed_over_since = now
        return batch

    def queued(self) -> list[ScheduledSequence]:
        """The queued sequences, interactive then batch (a copy)."""
        return [*self._queues[INTERACTIVE], *self._queues[BATCH]]

    def drop(self, request_key: Hashable) -> int:
        """Remove a request's queued sequences (cancellation); returns how many."""
        dropped = 0
        for priority, queue in self._queues.items():
            kept = deque(s for s in queue if s.request_key != request_key)
            if len(kept) != len(queue):
                dropped += len(queue) - len(kept)
                self.tokens[priority] = sum(s.num_tokens for s in kept)
                self._queues[priority] = kept
        self.queued_tokens = self.tokens[INTERACTIVE] + self.tokens[BATCH]
        return dropped

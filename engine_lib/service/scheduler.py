"""First-come-first-served batching of sequences under a token budget.

Pure Python (no torch): it sees only request keys and sequence lengths (and
where each sequence starts in its request's flat ids, for the service to gather).
Invariants: sequences leave in arrival order; a sequence is never split; a
sequence longer than the budget leaves alone; the head of the queue always
leaves in the next batch, so nothing starves.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Hashable, Iterable


@dataclass(frozen=True)
class ScheduledSequence:
    request_key: Hashable
    index: int  # position of the sequence inside its request
    num_tokens: int
    start: int  # offset of its first token in the request's flat ids


class FcfsBatcher:
    def __init__(self, max_batch_tokens: int, max_batch_sequences: int):
        if max_batch_tokens < 1 or max_batch_sequences < 1:
            raise ValueError("max_batch_tokens and max_batch_sequences must be >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_sequences = max_batch_sequences
        self._queue: deque[ScheduledSequence] = deque()
        self.queued_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, request_key: Hashable, seq_lens: Iterable[int]) -> None:
        added, start = [], 0
        for index, num_tokens in enumerate(seq_lens):
            if num_tokens < 1:
                raise ValueError(f"sequence {index} of {request_key!r} has {num_tokens} tokens")
            added.append(ScheduledSequence(request_key, index, int(num_tokens), start))
            start += int(num_tokens)
        self._queue.extend(added)
        self.queued_tokens += start

    def next_batch(self) -> list[ScheduledSequence]:
        """Pop the longest FCFS prefix that fits the budget and the sequence cap."""
        batch: list[ScheduledSequence] = []
        batch_tokens = 0
        while self._queue and len(batch) < self.max_batch_sequences:
            head = self._queue[0]
            if batch and batch_tokens + head.num_tokens > self.max_batch_tokens:
                break
            batch.append(self._queue.popleft())
            batch_tokens += head.num_tokens
        self.queued_tokens -= batch_tokens
        return batch

    def queued(self) -> list[ScheduledSequence]:
        """The queued sequences, in order (a copy)."""
        return list(self._queue)

    def drop(self, request_key: Hashable) -> int:
        """Remove a request's queued sequences (cancellation); returns how many."""
        kept = deque(s for s in self._queue if s.request_key != request_key)
        dropped = len(self._queue) - len(kept)
        if dropped:
            self.queued_tokens = sum(s.num_tokens for s in kept)
            self._queue = kept
        return dropped

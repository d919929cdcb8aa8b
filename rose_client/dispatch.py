"""Run chunks over replicas: bounded in flight per replica, failed chunks retried
on another replica, results handed to the caller's thread exactly once each.

Invariants: a chunk is held by at most one slot at a time and goes back to the
queue only after that slot gave up on it, so every chunk is delivered once. A
replica that failed is probed for health before it takes new work, so a dead
replica delays chunks but does not use up their attempts.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .chunking import Chunk
from .stream import ReplicaError


class Slot(Protocol):
    def embed(self, texts: list[str], parameters: dict | None) -> np.ndarray: ...
    def is_ready(self) -> bool: ...
    def close(self) -> None: ...


class JobFailed(RuntimeError):
    """The job cannot finish: a chunk failed too often, or no replica answers."""


@dataclass
class ReplicaState:
    url: str
    completed_chunks: int = 0
    failed_chunks: int = 0
    consecutive_failures: int = 0
    failing_since: float | None = None
    cooldown_until: float = 0.0


@dataclass
class _Task:
    chunk: Chunk
    attempts: int = 0
    failed_on: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4            # failures of one chunk on ready replicas before the job fails
    base_cooldown_s: float = 0.25    # a failed replica rests base * 2**(failures-1), capped
    max_cooldown_s: float = 5.0
    max_unavailable_s: float = 120.0  # every replica failing this long fails the job


class Dispatcher:
    def __init__(self, urls: Sequence[str], slot_factory: Callable[[str], Slot],
                 max_inflight_per_replica: int = 4, retry: RetryPolicy = RetryPolicy()):
        if not urls:
            raise ValueError("no replica addresses given")
        if max_inflight_per_replica < 1:
            raise ValueError("max_inflight_per_replica must be >= 1")
        self.replicas = [ReplicaState(url) for url in dict.fromkeys(urls)]
        self.slot_factory = slot_factory
        self.max_inflight_per_replica = max_inflight_per_replica
        self.retry = retry

    def run(self, chunks: Sequence[Chunk], texts_of: Callable[[Chunk], list[str]],
            on_result: Callable[[Chunk, np.ndarray], None], parameters: dict | None = None) -> None:
        """Blocks until every chunk went through `on_result` (called in this thread)."""
        job = _Job(self, chunks, texts_of, parameters)
        job.start()
        try:
            for _ in range(len(chunks)):
                chunk, rows = job.next_result()
                on_result(chunk, rows)
        finally:
            job.stop()


class _Job:
    def __init__(self, dispatcher: Dispatcher, chunks, texts_of, parameters):
        self.d = dispatcher
        self.texts_of = texts_of
        self.parameters = parameters
        self.pending = collections.deque(_Task(c) for c in chunks)
        self.results: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.stopping = False
        self.all_urls = {r.url for r in dispatcher.replicas}
        self.threads = [threading.Thread(target=self._work, args=(r,), daemon=True,
                                         name=f"rose-client-{r.url}-{i}")
                        for r in dispatcher.replicas for i in range(dispatcher.max_inflight_per_replica)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def next_result(self) -> tuple[Chunk, np.ndarray]:
        item = self.results.get()
        if isinstance(item, JobFailed):
            raise item
        return item

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(timeout=0.1)  # a slot stuck in a request is a daemon; its reply is dropped

    def _fail_job(self, message: str) -> None:
        self.stopping = True
        self.results.put(JobFailed(message))
        self.cond.notify_all()

    def _work(self, replica: ReplicaState) -> None:
        try:
            self._serve(replica)
        except Exception as exc:  # thread boundary: the caller must hear of it, not wait forever
            with self.cond:
                self._fail_job(f"worker for {replica.url} crashed: {exc!r}")
            raise

    def _serve(self, replica: ReplicaState) -> None:
        slot = self.d.slot_factory(replica.url)
        try:
            while (task := self._take(replica)) is not None:
                if replica.consecutive_failures and not slot.is_ready():
                    self._replica_failed(replica, task, counts_for_chunk=False, reason="not ready")
                    continue
                try:
                    rows = slot.embed(self.texts_of(task.chunk), self.parameters)
                except ReplicaError as exc:
                    if exc.input_rejected:
                        chunk = task.chunk
                        with self.cond:
                            self._fail_job(f"chunk {chunk.index} (texts {chunk.start}..{chunk.stop - 1}) "
                                           f"was refused: {exc}")
                        return
                    self._replica_failed(replica, task, counts_for_chunk=True, reason=str(exc))
                    continue
                with self.cond:
                    replica.completed_chunks += 1
                    replica.consecutive_failures, replica.failing_since = 0, None
                    if not self.stopping:
                        self.results.put((task.chunk, rows))
        finally:
            slot.close()

    def _eligible(self, task: _Task, url: str) -> bool:
        return url not in task.failed_on or task.failed_on >= self.all_urls

    def _take(self, replica: ReplicaState) -> _Task | None:
        with self.cond:
            while not self.stopping:
                self._check_unavailable()
                wait = replica.cooldown_until - time.monotonic()
                if wait <= 0:
                    for task in self.pending:
                        if self._eligible(task, replica.url):
                            self.pending.remove(task)
                            return task
                self.cond.wait(timeout=min(max(wait, 0.05), 1.0))
            return None

    def _check_unavailable(self) -> None:
        since = [r.failing_since for r in self.d.replicas]
        if self.pending and all(s is not None for s in since):
            down_for = time.monotonic() - max(since)
            if down_for > self.d.retry.max_unavailable_s:
                self._fail_job(f"no replica answered for {down_for:.0f}s: "
                               + ", ".join(r.url for r in self.d.replicas))

    def _replica_failed(self, replica: ReplicaState, task: _Task, counts_for_chunk: bool, reason: str) -> None:
        retry = self.d.retry
        with self.cond:
            now = time.monotonic()
            replica.consecutive_failures += 1
            replica.failing_since = replica.failing_since or now
            replica.cooldown_until = now + min(retry.base_cooldown_s * 2 ** (replica.consecutive_failures - 1),
                                               retry.max_cooldown_s)
            if counts_for_chunk:
                replica.failed_chunks += 1
                task.attempts += 1
                task.failed_on.add(replica.url)
                if task.attempts >= retry.max_attempts:
                    chunk = task.chunk
                    self._fail_job(f"chunk {chunk.index} (texts {chunk.start}..{chunk.stop - 1}) failed "
                                   f"{task.attempts} times; last error: {reason}")
                    return
            self.pending.appendleft(task)
            self.cond.notify_all()

"""Run chunks over replicas with threads: bounded in flight per replica, failed
chunks retried on another replica, results handed to the caller's thread
exactly once each. The queueing and retry rules live in scheduling.py (shared
with the asyncio dispatcher in aio.py).

A replica that failed is probed for health before it takes new work, so a dead
replica delays chunks but does not use up their attempts.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from .chunking import Chunk
from .scheduling import ReplicaState, RetryPolicy, Task, TaskQueue, describe
from .stream import ReplicaError

__all__ = ["Dispatcher", "JobFailed", "ReplicaState", "RetryPolicy", "Slot"]


class Slot(Protocol):
    def embed(self, texts: list[str], parameters: dict | None) -> np.ndarray: ...
    def is_ready(self) -> bool: ...
    def close(self) -> None: ...


class JobFailed(RuntimeError):
    """The job cannot finish: a chunk failed too often, or no replica answers."""

    last_error: ReplicaError | None = None  # the last replica error behind it, when known


class Dispatcher:
    def __init__(self, urls: Sequence[str], slot_factory: Callable[[str], Slot],
                 max_inflight_per_replica: int = 4, retry: RetryPolicy = RetryPolicy()):
        if not urls:
            raise ValueError("no replica addresses given")
        if max_inflight_per_replica < 1:
            raise ValueError("max_inflight_per_replica must be >= 1")
        self.urls = list(dict.fromkeys(urls))
        self.replicas = [ReplicaState(url) for url in self.urls]
        self.slot_factory = slot_factory
        self.max_inflight_per_replica = max_inflight_per_replica
        self.retry = retry

    def run(self, chunks: Sequence[Chunk], texts_of: Callable[[Chunk], list[str]],
            on_result: Callable[[Chunk, np.ndarray], None], parameters: dict | None = None) -> None:
        """Blocks until every chunk went through `on_result` (called in this thread)."""
        job = _Job(self, chunks, texts_of, parameters)
        self.replicas = list(job.tasks.replicas.values())
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
        self.tasks = TaskQueue(dispatcher.urls, dispatcher.retry)
        self.tasks.push(Task(c) for c in chunks)
        self.results: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.stopping = False
        self.threads = [threading.Thread(target=self._work, args=(url,), daemon=True,
                                         name=f"rose-client-{url}-{i}")
                        for url in dispatcher.urls for i in range(dispatcher.max_inflight_per_replica)]

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

    def _work(self, url: str) -> None:
        try:
            self._serve(url)
        except Exception as exc:  # thread boundary: the caller must hear of it, not wait forever
            with self.cond:
                self._fail_job(f"worker for {url} crashed: {exc!r}")
            raise

    def _serve(self, url: str) -> None:
        slot = self.d.slot_factory(url)
        replica = self.tasks.replicas[url]
        try:
            while (task := self._take(url)) is not None:
                if replica.consecutive_failures and not slot.is_ready():
                    with self.cond:
                        self.tasks.replica_unready(url, task, time.monotonic())
                        self.cond.notify_all()
                    continue
                try:
                    rows = slot.embed(self.texts_of(task.chunk), self.parameters)
                except ReplicaError as exc:
                    with self.cond:
                        if exc.input_rejected:
                            self._fail_job(f"{describe(task.chunk)} was refused: {exc}")
                            return
                        failure = self.tasks.chunk_failed(url, task, str(exc), time.monotonic())
                        if failure is not None:
                            self._fail_job(failure)
                        self.cond.notify_all()
                    continue
                with self.cond:
                    self.tasks.succeeded(url)
                    if not self.stopping:
                        self.results.put((task.chunk, rows))
        finally:
            slot.close()

    def _take(self, url: str) -> Task | None:
        with self.cond:
            while not self.stopping:
                now = time.monotonic()
                if (failure := self.tasks.unavailable_message(now)) is not None:
                    self._fail_job(failure)
                    break
                if (task := self.tasks.take(url, now)) is not None:
                    return task
                self.cond.wait(timeout=min(max(self.tasks.wait_s(url, now), 0.05), 1.0))
            return None

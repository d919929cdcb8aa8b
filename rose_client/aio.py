"""Run chunks over replicas with asyncio, for the gateway and the bulk client
alike: persistent slot workers per replica pull chunks of every job from one
FCFS queue, so the in-flight bound per replica holds across all jobs; failed
chunks are retried on another replica (rules in scheduling.py).

A replica that failed is probed for health before it takes new work, so a dead
replica delays chunks but does not use up their attempts.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol, Sequence

from .aio_stream import ReplicaError
from .chunking import Chunk
from .scheduling import RetryPolicy, Task, TaskQueue, describe


class AsyncSlot(Protocol):
    async def call(self, payload: Any) -> Any: ...
    async def is_ready(self) -> bool: ...
    async def close(self) -> None: ...


class JobFailed(RuntimeError):
    """The job cannot finish: a chunk failed too often, or no replica answers."""

    last_error: ReplicaError | None = None  # the last replica error behind it, when known


class ChunkRefused(JobFailed):
    """A replica refused a chunk as invalid input: every replica would."""

    def __init__(self, message: str, error: ReplicaError):
        super().__init__(message)
        self.error = error


class _Job:
    def __init__(self, chunks: Sequence[Chunk], payload_of: Callable[[Chunk], Any],
                 on_result: Callable[[Chunk, Any], None] | None):
        self.payload_of = payload_of
        self.on_result = on_result
        self.results: dict[int, Any] = {}
        self.expected = len(chunks)
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.last_error: ReplicaError | None = None

    def deliver(self, chunk: Chunk, result: Any) -> None:
        if self.done.done() or chunk.index in self.results:
            return
        self.results[chunk.index] = result if self.on_result is None else None
        if self.on_result is not None:
            try:
                self.on_result(chunk, result)
            except Exception as exc:  # the caller's callback failed: so does its job
                self.done.set_exception(exc)
                return
        if len(self.results) == self.expected:
            self.done.set_result(None)

    def fail(self, error: JobFailed) -> None:
        if not self.done.done():
            error.last_error = self.last_error
            self.done.set_exception(error)


class AsyncDispatcher:
    """`await run(chunks, payload_of)` -> results in chunk order; raises JobFailed
    (`.last_error`: the last ReplicaError seen by the job, or None). With `on_result`,
    each chunk's result goes there once, as it arrives, and is not kept."""

    def __init__(self, urls: Sequence[str], slot_factory: Callable[[str], AsyncSlot],
                 max_inflight_per_replica: int = 4, retry: RetryPolicy = RetryPolicy(),
                 on_retry: Callable[[str, ReplicaError], None] | None = None):
        if max_inflight_per_replica < 1:
            raise ValueError("max_inflight_per_replica must be >= 1")
        self.tasks = TaskQueue(urls, retry)
        self.slot_factory = slot_factory
        self.max_inflight_per_replica = max_inflight_per_replica
        self.on_retry = on_retry
        self.inflight: dict[str, int] = {}
        self._workers: dict[str, list[asyncio.Task]] = {}
        self._idle: dict[str, list[asyncio.Future]] = {}  # per replica: futures of workers waiting for work
        self._started = False
        self._closing = False

    @property
    def urls(self) -> list[str]:
        return list(self.tasks.replicas)

    async def start(self) -> None:
        self._started = True
        self.set_replicas(self.urls)

    def set_replicas(self, urls: Sequence[str]) -> None:
        """Start workers for new addresses; workers of dropped ones end after their chunk."""
        self.tasks.set_replicas(urls)
        for url in self.tasks.replicas:
            if url not in self._workers:
                self.inflight[url] = 0
                self._workers[url] = [asyncio.create_task(self._work(url), name=f"slot-{url}-{i}")
                                      for i in range(self.max_inflight_per_replica)]
        for url in [u for u in self._workers if u not in self.tasks.replicas]:
            self._workers.pop(url)
            self.inflight.pop(url, None)
        self._notify_all()

    async def close(self) -> None:
        self._closing = True
        self._notify_all()
        workers = [w for ws in self._workers.values() for w in ws]
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._workers.clear()

    async def run(self, chunks: Sequence[Chunk], payload_of: Callable[[Chunk], Any],
                  on_result: Callable[[Chunk, Any], None] | None = None) -> list[Any]:
        if not chunks:
            return []
        job = _Job(chunks, payload_of, on_result)
        self.tasks.push(Task(c, job) for c in chunks)
        self._wake(len(chunks))
        try:
            await job.done
        finally:
            if not job.done.done():  # the caller went away: drop what is still queued
                job.fail(JobFailed("cancelled by the caller"))
            self.tasks.drop(lambda t: t.job is not job)
        return [job.results[c.index] for c in chunks]

    def _notify_all(self) -> None:
        """Wake every idle worker (after a failure or a change of replicas)."""
        self._wake(None)

    def _wake(self, count: int | None) -> None:
        """Wake `count` idle workers (None: all), least busy replicas first, one per replica
        per round; workers of resting replicas stay asleep (they wake when the rest ends).
        The loop is single-threaded: no lock is needed."""
        if not self._started:
            return
        now = time.monotonic()
        ready = sorted((u for u, idle in self._idle.items() if idle and (count is None or self.tasks.wait_s(u, now) == 0)),
                       key=lambda u: self.inflight.get(u, 0))
        while ready and (count is None or count > 0):
            for url in list(ready):
                if count is not None and count <= 0:
                    break
                waiter = self._idle[url].pop()
                if not waiter.done():
                    waiter.set_result(None)
                    count = None if count is None else count - 1
                if not self._idle[url]:
                    ready.remove(url)

    async def _take(self, url: str) -> Task | None:
        while not self._closing and url in self.tasks.replicas:
            now = time.monotonic()
            if (failure := self.tasks.unavailable_message(now)) is not None:
                for task in list(self.tasks.pending):
                    task.job.fail(JobFailed(failure))
                self.tasks.drop(lambda t: False)
            task = self.tasks.take(url, now)
            while task is not None and task.job.done.done():  # its job failed or left
                task = self.tasks.take(url, now)
            if task is not None:
                return task
            waiter = asyncio.get_running_loop().create_future()
            idle = self._idle.setdefault(url, [])
            idle.append(waiter)
            try:
                await asyncio.wait([waiter], timeout=min(max(self.tasks.wait_s(url, now), 0.05), 1.0))
            finally:
                if waiter in idle:
                    idle.remove(waiter)
        return None

    async def _work(self, url: str) -> None:
        slot = self.slot_factory(url)
        try:
            while (task := await self._take(url)) is not None:
                await self._run_task(url, slot, task)
        finally:
            await slot.close()

    async def _run_task(self, url: str, slot: AsyncSlot, task: Task) -> None:
        job: _Job = task.job
        replica = self.tasks.replicas.get(url)
        if replica is not None and replica.consecutive_failures and not await slot.is_ready():
            self.tasks.replica_unready(url, task, time.monotonic())
            self._notify_all()
            return
        self.inflight[url] = self.inflight.get(url, 0) + 1
        try:
            result = await slot.call(job.payload_of(task.chunk))
        except ReplicaError as exc:
            job.last_error = exc
            if exc.input_rejected:
                job.fail(ChunkRefused(f"{describe(task.chunk)} was refused: {exc}", exc))
                return
            if self.on_retry is not None:
                self.on_retry(url, exc)
            failure = self.tasks.chunk_failed(url, task, str(exc), time.monotonic())
            if failure is not None:
                job.fail(JobFailed(failure))
            self._notify_all()
            return
        finally:
            if url in self.inflight:
                self.inflight[url] -= 1
        self.tasks.succeeded(url)
        job.deliver(task.chunk, result)


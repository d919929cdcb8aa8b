"""Run chunks over replicas with asyncio, for the gateway and the bulk client
alike: persistent slot workers per replica pull chunks of every job from one
FCFS queue, so the in-flight bound per replica holds across all jobs; failed
chunks are retried on another replica (rules in scheduling.py).

A replica that failed is probed for health before it takes new work, so a dead
replica delays chunks but does not use up their attempts.

Every chunk a worker takes is answered, whatever happens: delivered, put back
for another attempt, or its job failed with a named error (JobFailed and its
subclasses). A worker that met an unexpected fault (a locally cancelled call, a
bug) drops its slot and is replaced; a job's future always resolves.

Coalescing (jobs run with a `Merge`, coalesce.py): a worker that takes a chunk
while more chunks wait than free workers would take at once adds waiting chunks
of jobs with the same merge key, in the jobs' turn order, up to the merge's
limits, and sends them as one call; the rows go back to each chunk by offset.
No timer: a free worker never waits for company. A shared call the replica
refuses as invalid input, or that cannot be built or sent, is split: its chunks
go back to the queue, each to run alone (no attempt counted), so one job's bad
input fails that job only.

Background jobs (`run(..., background=True)`: the gateway's batch jobs) take at most half of a
replica's workers (at least one): the others run only foreground chunks, so live requests find
free slots however long a background job is, and several live callers do not queue behind one
slot while a job runs (`background_workers`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Protocol, Sequence

from .aio_stream import PayloadError, ReplicaError
from .chunking import Chunk
from .coalesce import Merge
from .scheduling import RetryPolicy, Task, TaskQueue, describe

log = logging.getLogger("rose_client")
RESTART_DELAY_S = 0.1  # a worker that crashed outside a chunk is replaced after this (no hot loop)


class AsyncSlot(Protocol):
    async def call(self, payload: Any) -> Any:
        """-> the result; raises ReplicaError (the replica failed or refused it) or PayloadError
        (the payload cannot be sent at all). Anything else is a fault of this process."""
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


class DispatchFault(JobFailed):
    """A chunk failed in this process, not on a replica: a locally cancelled call or a bug,
    on every attempt (the chunk was retried, its worker replaced each time)."""


class ChunkUnsendable(DispatchFault):
    """A chunk's request could not be built or encoded (`payload_of` or the slot refused it):
    the same on every replica, so it is not retried."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause


class _Job:
    def __init__(self, chunks: Sequence[Chunk], payload_of: Callable[[Chunk], Any],
                 on_result: Callable[[Chunk, Any], None] | None, merge: Merge | None = None,
                 background: bool = False):
        self.payload_of = payload_of
        self.background = background
        self.on_result = on_result
        self.merge = merge
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


def _foreground(task: Task) -> bool:
    return not task.job.background


def background_workers(workers_per_replica: int) -> int:
    """Workers of a replica that may take background chunks: half, rounded down, at least one."""
    return max(1, workers_per_replica // 2)


class AsyncDispatcher:
    """`await run(chunks, payload_of)` -> results in chunk order; raises JobFailed
    (`.last_error`: the last ReplicaError seen by the job, or None). With `on_result`,
    each chunk's result goes there once, as it arrives, and is not kept. With `merge`,
    the job's chunks may share calls with other jobs' of the same merge key."""

    def __init__(self, urls: Sequence[str], slot_factory: Callable[[str], AsyncSlot],
                 max_inflight_per_replica: int = 4, retry: RetryPolicy = RetryPolicy(),
                 on_retry: Callable[[str, ReplicaError], None] | None = None):
        if max_inflight_per_replica < 1:
            raise ValueError("max_inflight_per_replica must be >= 1")
        self.tasks = TaskQueue(urls, retry)
        self.slot_factory = slot_factory
        self.max_inflight_per_replica = max_inflight_per_replica
        self.on_retry = on_retry
        self.inflight: dict[str, int] = {}  # served replicas, and dropped ones still finishing chunks
        self._workers: dict[str, set[asyncio.Task]] = {}  # per served replica: its live workers
        self._worker_urls: dict[asyncio.Task, str] = {}  # every running worker, draining ones too
        self._idle: dict[str, list[asyncio.Future]] = {}  # per replica: futures of workers waiting for work
        self._busy: set[asyncio.Task] = set()  # workers holding chunks
        self._foreground_only: set[asyncio.Task] = set()  # workers that take no background chunk
        self.calls = 0  # calls answered by replicas
        self.merged_chunks = 0  # chunks answered in a call shared with other chunks
        self._started = False
        self._closing = False

    @property
    def urls(self) -> list[str]:
        return list(self.tasks.replicas)

    def has_workers(self, url: str) -> bool:
        """Some worker of `url` still runs (for a dropped replica: a chunk is still in flight there)."""
        return url in self._worker_urls.values()

    async def start(self) -> None:
        self._started = True
        self.set_replicas(self.urls)

    def set_replicas(self, urls: Sequence[str]) -> None:
        """Start workers for new addresses; workers of dropped ones finish the chunk they hold
        (it is not cancelled), then end."""
        self.tasks.set_replicas(urls)
        for url in self.tasks.replicas:
            if url not in self._workers:
                self.inflight.setdefault(url, 0)
                self._workers[url] = set()
                foreground_only = self.max_inflight_per_replica - background_workers(self.max_inflight_per_replica)
                for i in range(self.max_inflight_per_replica):
                    self._start_worker(url, foreground_only=i < foreground_only)
        for url in [u for u in self._workers if u not in self.tasks.replicas]:
            self._workers.pop(url)
            if not self.has_workers(url):
                self.inflight.pop(url, None)
        self._notify_all()

    async def close(self) -> None:
        self._closing = True
        self._notify_all()
        workers = list(self._worker_urls)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._workers.clear()
        for task in self.tasks.pending:
            task.job.fail(JobFailed("the dispatcher closed"))
        self.tasks.drop(lambda t: False)

    async def run(self, chunks: Sequence[Chunk], payload_of: Callable[[Chunk], Any],
                  on_result: Callable[[Chunk, Any], None] | None = None, merge: Merge | None = None,
                  background: bool = False) -> list[Any]:
        if not chunks:
            return []
        if self._closing:
            raise JobFailed("the dispatcher is closed")
        job = _Job(chunks, payload_of, on_result, merge, background)
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

    def _start_worker(self, url: str, delay: float = 0.0, foreground_only: bool = False) -> None:
        worker = asyncio.create_task(self._work(url, delay), name=f"slot-{url}")
        if foreground_only:
            self._foreground_only.add(worker)
        self._workers[url].add(worker)
        self._worker_urls[worker] = url
        worker.add_done_callback(self._worker_ended)

    def _worker_ended(self, worker: asyncio.Task) -> None:
        """A live worker only ends on a fault (a dropped replica's and a closing dispatcher's
        end for good): start its replacement."""
        url = self._worker_urls.pop(worker)
        self._busy.discard(worker)
        foreground_only = worker in self._foreground_only
        self._foreground_only.discard(worker)
        live = self._workers.get(url, set())
        if worker in live:
            live.discard(worker)
            if not self._closing:
                crashed = worker.cancelled() or worker.exception() is not None
                delay = None if crashed else worker.result()
                self._start_worker(url, RESTART_DELAY_S if delay is None else delay, foreground_only)
        if url not in self._workers and not self.has_workers(url):
            self.inflight.pop(url, None)  # a dropped replica has drained

    async def _take(self, url: str) -> Task | None:
        me = asyncio.current_task()
        while not self._closing and me in self._workers.get(url, ()):
            now = time.monotonic()
            if (failure := self.tasks.unavailable_message(now)) is not None:
                for task in list(self.tasks.pending):
                    task.job.fail(JobFailed(failure))
                self.tasks.drop(lambda t: False)
            accept = _foreground if me in self._foreground_only else None
            task = self.tasks.take(url, now, accept)
            while task is not None and task.job.done.done():  # its job failed or left
                task = self.tasks.take(url, now, accept)
            if task is not None:
                self._busy.add(me)
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

    async def _work(self, url: str, delay: float) -> float | None:
        """Take and answer chunks until the replica is dropped or the dispatcher closes.
        -> None, or (after a fault) the delay before the replacement worker starts."""
        group: list[Task] = []
        slot = None
        me = asyncio.current_task()
        try:
            if delay:
                await asyncio.sleep(delay)
            slot = self.slot_factory(url)
            while (task := await self._take(url)) is not None:
                group = [task]  # held chunks: a fault from here on answers each of them
                self._coalesce(url, group)
                healthy = await self._run_group(url, slot, group)
                group = []
                self._busy.discard(me)
                if not healthy:
                    return 0.0
            return None
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # close(): the held chunks' jobs end with them
                for task in group:
                    task.job.fail(JobFailed("the dispatcher closed"))
                raise
            return self._crashed(url, group, "cancelled")
        except Exception as exc:
            return self._crashed(url, group, f"{type(exc).__name__}: {exc}")
        finally:
            self._busy.discard(me)
            if slot is not None:
                try:
                    await slot.close()
                except Exception:
                    log.exception("closing a slot of %s failed", url)

    def _crashed(self, url: str, group: list[Task], reason: str) -> float:
        log.exception("a dispatcher worker of %s failed (%s); it is replaced", url, reason)
        if group:
            self._fault(url, group, reason)
        return RESTART_DELAY_S

    def _free_workers(self, now: float) -> int:
        """Workers that would take a queued chunk at once: holding none, their replica not resting."""
        return sum(1 for url, workers in self._workers.items() if self.tasks.wait_s(url, now) == 0
                   for worker in workers if worker not in self._busy)

    def _coalesce(self, url: str, group: list[Task]) -> None:
        """Add to `group` (its first chunk) the chunks that wait beyond what free workers take
        now and may share its call."""
        first = group[0]
        merge: Merge | None = first.job.merge
        if merge is None or first.solo:
            return
        now = time.monotonic()
        waiting = len(self.tasks) - self._free_workers(now)
        tokens, texts = first.chunk.num_tokens, first.chunk.num_texts

        def fits(task: Task) -> bool:
            other: Merge | None = task.job.merge
            return (other is not None and other.key == merge.key and not task.solo and not task.job.done.done()
                    and (first.job.background or not task.job.background)  # a live call carries no job's chunk
                    and tokens + task.chunk.num_tokens <= merge.max_tokens
                    and texts + task.chunk.num_texts <= merge.max_texts)

        while waiting > 0 and (task := self.tasks.take(url, now, fits)) is not None:
            group.append(task)
            tokens, texts, waiting = tokens + task.chunk.num_tokens, texts + task.chunk.num_texts, waiting - 1

    def _resplit(self, group: list[Task]) -> None:
        """Back to the queue, each chunk to run alone (no attempt counted), in their order."""
        for task in reversed(group):
            task.solo = True
            self.tasks.requeue(task)
        self._notify_all()

    async def _run_group(self, url: str, slot: AsyncSlot, group: list[Task]) -> bool:
        """Answer the chunks of `group` (one call) on `url`: deliver their rows, put them back,
        or fail their jobs. -> False when the slot met a fault: the worker then ends and is replaced."""
        replica = self.tasks.replicas.get(url)
        if replica is not None and replica.consecutive_failures and not await slot.is_ready():
            for task in reversed(group[1:]):
                self.tasks.requeue(task)
            self.tasks.replica_unready(url, group[0], time.monotonic())
            self._notify_all()
            return True
        payloads = []
        for task in list(group):
            try:
                if task.job.done.done():  # its job failed or left meanwhile
                    raise LookupError
                payloads.append(task.job.payload_of(task.chunk))
            except LookupError:
                group.remove(task)
            except Exception as exc:
                group.remove(task)
                task.job.fail(ChunkUnsendable(f"{describe(task.chunk)} could not be built: "
                                              f"{type(exc).__name__}: {exc}", exc))
        if not group:
            return True
        if len(group) == 1:
            payload = payloads[0]
        else:
            try:
                payload = group[0].job.merge.combine(payloads)
            except Exception:
                log.exception("merging %d chunks failed; each is sent alone", len(group))
                self._resplit(group)
                return True
        self.inflight[url] = self.inflight.get(url, 0) + 1
        try:
            result = await slot.call(payload)
        except ReplicaError as exc:
            self._replica_failed(url, group, exc)
            return True
        except PayloadError as exc:
            if len(group) > 1:
                self._resplit(group)
            else:
                group[0].job.fail(ChunkUnsendable(f"{describe(group[0].chunk)} cannot be sent: {exc}", exc))
            return True
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # this worker is being cancelled (close): _work answers the chunks
            self._fault(url, group, "the call was cancelled locally")  # e.g. gRPC could not serialise it
            return False
        except Exception as exc:
            log.exception("%s failed on %s in this process", ", ".join(describe(t.chunk) for t in group), url)
            self._fault(url, group, f"{type(exc).__name__}: {exc}")
            return False
        finally:
            if url in self.inflight:
                self.inflight[url] -= 1
        self.tasks.succeeded(url, len(group))
        self.calls += 1
        if len(group) == 1:
            group[0].job.deliver(group[0].chunk, result)
            return True
        try:
            parts = group[0].job.merge.split(result, [t.chunk.num_texts for t in group])
        except Exception as exc:
            self._fault(url, group, f"the shared answer does not split: {type(exc).__name__}: {exc}")
            return True
        self.merged_chunks += len(group)
        for task, part in zip(group, parts):
            task.job.deliver(task.chunk, part)
        return True

    def _replica_failed(self, url: str, group: list[Task], exc: ReplicaError) -> None:
        for task in group:
            task.job.last_error = exc
        if exc.input_rejected:
            if len(group) > 1:  # whose input? each chunk goes again alone
                self._resplit(group)
                return
            group[0].job.fail(ChunkRefused(f"{describe(group[0].chunk)} was refused: {exc}", exc))
            return
        if self.on_retry is not None:
            for _ in group:
                try:
                    self.on_retry(url, exc)
                except Exception:
                    log.exception("on_retry failed")
        self._count_failure(url, group, str(exc), JobFailed, blame_replica=True)

    def _fault(self, url: str, group: list[Task], reason: str) -> None:
        """The call failed here, not on the replica: another attempt (the replica is not blamed),
        or its job fails with DispatchFault after the last one."""
        self._count_failure(url, group, reason, DispatchFault, blame_replica=False)

    def _count_failure(self, url: str, group: list[Task], reason: str, error: type[JobFailed],
                       blame_replica: bool) -> None:
        """One failed attempt for each chunk of the call (the replica rests once for it); each
        goes back to the front of its job's queue, in order, or its job fails."""
        now = time.monotonic()
        for i in reversed(range(len(group))):
            task = group[i]
            failure = self.tasks.chunk_failed(url, task, reason, now, blame_replica=blame_replica and i == 0)
            if failure is not None:
                task.job.fail(error(failure))
        self._notify_all()

"""Which replica takes which chunk next: jobs take turns (round-robin, one chunk
each, FCFS within a job), per-replica cool-down after failures, retry
elsewhere, give up after too many failures. Plain data, no threads and no I/O:
the asyncio dispatcher (aio.py) calls it from its event loop.

Invariant: a task is either in the queue or held by exactly one caller that
took it; it goes back only through `chunk_failed` / `replica_unready`, to the
front of its job's queue, and that job goes first (a retry waits for no one).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from .chunking import Chunk


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4            # failures of one chunk on ready replicas before the job fails
    base_cooldown_s: float = 0.25    # a failed replica rests base * 2**(failures-1), capped
    max_cooldown_s: float = 5.0
    max_unavailable_s: float = 120.0  # every replica failing this long fails the job


@dataclass
class ReplicaState:
    url: str
    completed_chunks: int = 0
    failed_chunks: int = 0
    consecutive_failures: int = 0
    failing_since: float | None = None
    cooldown_until: float = 0.0

    def succeeded(self, chunks: int = 1) -> None:
        self.completed_chunks += chunks
        self.consecutive_failures, self.failing_since = 0, None

    def failed(self, retry: RetryPolicy, now: float) -> None:
        self.consecutive_failures += 1
        self.failing_since = self.failing_since or now
        self.cooldown_until = now + min(retry.base_cooldown_s * 2 ** (self.consecutive_failures - 1),
                                        retry.max_cooldown_s)


@dataclass(eq=False)
class Task:
    chunk: Chunk
    job: Any = None  # the owner (the dispatcher keeps several jobs in one queue)
    attempts: int = 0
    failed_on: set[str] = field(default_factory=set)
    solo: bool = False  # runs in a call of its own (a call it shared was refused: aio.py)


def describe(chunk: Chunk) -> str:
    return f"chunk {chunk.index} (texts {chunk.start}..{chunk.stop - 1})"


class TaskQueue:
    """Pending tasks and replica states; callers serialise access. Each job (`Task.job`)
    has its own queue and the jobs take turns, so one big job cannot starve the small
    ones queued behind it."""

    def __init__(self, urls: Sequence[str], retry: RetryPolicy):
        if not urls:
            raise ValueError("no replica addresses given")
        self.retry = retry
        self.replicas: dict[str, ReplicaState] = {}
        # job -> its queued tasks; the dict's order is the turn order (first = next)
        self._jobs: collections.OrderedDict[Any, collections.deque[Task]] = collections.OrderedDict()
        self.set_replicas(urls)

    @property
    def pending(self) -> list[Task]:
        """Every queued task, job by job in turn order (a snapshot)."""
        return [task for tasks in self._jobs.values() for task in tasks]

    def __len__(self) -> int:
        return sum(map(len, self._jobs.values()))

    def set_replicas(self, urls: Iterable[str]) -> None:
        """Keep the state of replicas still listed, add new ones, forget the rest."""
        urls = list(dict.fromkeys(urls))
        self.replicas = {url: self.replicas.get(url) or ReplicaState(url) for url in urls}

    def push(self, tasks: Iterable[Task]) -> None:
        """Queue tasks behind their job's; a new job takes its turn after the jobs queued now."""
        for task in tasks:
            self._jobs.setdefault(task.job, collections.deque()).append(task)

    def drop(self, keep: Callable[[Task], bool]) -> None:
        for job, tasks in list(self._jobs.items()):
            kept = collections.deque(t for t in tasks if keep(t))
            if kept:
                self._jobs[job] = kept
            else:
                del self._jobs[job]

    def requeue(self, task: Task) -> None:
        """Back to the front of its job's queue, and that job goes next (attempts unchanged)."""
        self._requeue(task)

    def _requeue(self, task: Task) -> None:
        """Back to the front of its job's queue, and that job goes next."""
        self._jobs.setdefault(task.job, collections.deque()).appendleft(task)
        self._jobs.move_to_end(task.job, last=False)

    def _eligible(self, task: Task, url: str) -> bool:
        """Not on a replica that failed it, unless every replica has."""
        return url not in task.failed_on or task.failed_on >= set(self.replicas)

    def wait_s(self, url: str, now: float) -> float:
        """Seconds until `url` may take work (0: now)."""
        return max(self.replicas[url].cooldown_until - now, 0.0)

    def take(self, url: str, now: float, accept: Callable[[Task], bool] | None = None) -> Task | None:
        """The first task `url` may run of the first job in turn that has one (and whose first
        such task `accept` takes, when given); that job's turn then passes (it goes last)."""
        if url not in self.replicas or self.wait_s(url, now) > 0:
            return None
        for job, tasks in self._jobs.items():
            task = next((t for t in tasks if self._eligible(t, url)), None)
            if task is None or (accept is not None and not accept(task)):
                continue
            tasks.remove(task)
            if tasks:
                self._jobs.move_to_end(job)
            else:
                del self._jobs[job]
            return task
        return None

    def succeeded(self, url: str, chunks: int = 1) -> None:
        if url in self.replicas:
            self.replicas[url].succeeded(chunks)

    def replica_unready(self, url: str, task: Task, now: float) -> None:
        """`url` was not ready to take `task`: the replica rests, the task keeps its attempts."""
        if url in self.replicas:
            self.replicas[url].failed(self.retry, now)
        self._requeue(task)

    def chunk_failed(self, url: str, task: Task, reason: str, now: float, blame_replica: bool = True) -> str | None:
        """Count a failure of `task` on `url`; requeue it at the front, or return why its job fails.
        `blame_replica=False`: the failure was the caller's own (the replica does not rest)."""
        replica = self.replicas.get(url)
        if replica is not None and blame_replica:
            replica.failed(self.retry, now)
            replica.failed_chunks += 1
        task.attempts += 1
        task.failed_on.add(url)
        if task.attempts >= self.retry.max_attempts:
            return f"{describe(task.chunk)} failed {task.attempts} times; last error: {reason}"
        self._requeue(task)
        return None

    def unavailable_message(self, now: float) -> str | None:
        """Why the waiting work must fail: every replica failing for too long."""
        since = [r.failing_since for r in self.replicas.values()]
        if self._jobs and since and all(s is not None for s in since):
            down_for = now - max(since)
            if down_for > self.retry.max_unavailable_s:
                return f"no replica answered for {down_for:.0f}s: " + ", ".join(self.replicas)
        return None

"""rose_client/scheduling.py's queue: jobs take turns, so a big job cannot starve the
small ones queued behind it; a retried chunk goes first. And the same through the
async dispatcher (rose_client/aio.py) with an in-process replica."""
import asyncio

import numpy as np

from rose_client.aio import AsyncDispatcher
from rose_client.chunking import Chunk, plan_chunks
from rose_client.scheduling import RetryPolicy, Task, TaskQueue


def tasks(job, num_chunks):
    return [Task(Chunk(i, i, i + 1, 1), job) for i in range(num_chunks)]


def take_all(queue, url="a"):
    order = []
    while (task := queue.take(url, 0.0)) is not None:
        order.append((task.job, task.chunk.index))
    return order


def test_jobs_take_turns_one_chunk_each():
    queue = TaskQueue(["a"], RetryPolicy())
    queue.push(tasks("big", 5))
    queue.push(tasks("small", 2))
    queue.push(tasks("tiny", 1))
    assert take_all(queue) == [("big", 0), ("small", 0), ("tiny", 0), ("big", 1), ("small", 1),
                               ("big", 2), ("big", 3), ("big", 4)]


def test_a_job_queued_behind_a_big_one_starts_at_the_next_turn():
    queue = TaskQueue(["a"], RetryPolicy())
    queue.push(tasks("big", 100))
    assert [queue.take("a", 0.0).chunk.index for _ in range(10)] == list(range(10))
    queue.push(tasks("small", 1))
    assert take_all(queue)[:3] == [("big", 10), ("small", 0), ("big", 11)]


def test_a_retried_chunk_goes_first_and_keeps_its_job_order():
    queue = TaskQueue(["a", "b"], RetryPolicy(max_attempts=3, base_cooldown_s=0.0, max_cooldown_s=0.0))
    queue.push(tasks("big", 3))
    queue.push(tasks("small", 2))
    first = queue.take("a", 0.0)
    assert (first.job, first.chunk.index) == ("big", 0)
    assert queue.chunk_failed("a", first, "boom", 0.0) is None
    # the failed chunk goes next, on the other replica; then the turns go on
    assert take_all(queue, "b") == [("big", 0), ("small", 0), ("big", 1), ("small", 1), ("big", 2)]


def test_drop_and_pending_see_every_job():
    queue = TaskQueue(["a"], RetryPolicy())
    queue.push(tasks("x", 2))
    queue.push(tasks("y", 2))
    assert [(t.job, t.chunk.index) for t in queue.pending] == [("x", 0), ("x", 1), ("y", 0), ("y", 1)]
    queue.drop(lambda t: t.job != "x")
    assert take_all(queue) == [("y", 0), ("y", 1)] and queue.pending == []


def test_a_small_request_behind_a_big_one_is_answered_first():
    """One replica, one slot: a job of 50 chunks is queued, then a job of 1 chunk.
    Under FCFS the small job would wait for all 50; with turns it runs second."""
    calls = []

    class Slot:
        async def call(self, payload):
            calls.append(payload[0])
            await asyncio.sleep(0)
            return np.array([[payload[1]]], dtype=np.float32)

        async def is_ready(self):
            return True

        async def close(self):
            pass

    async def scenario():
        dispatcher = AsyncDispatcher(["a"], lambda url: Slot(), 1, RetryPolicy())
        await dispatcher.start()
        try:
            big = asyncio.ensure_future(dispatcher.run(plan_chunks([1] * 50, 1, 1), lambda c: ("big", c.start)))
            await asyncio.sleep(0)  # the big job is queued (and its first chunk taken) first
            small = await dispatcher.run(plan_chunks([1], 1, 1), lambda c: ("small", c.start))
            rows = await big
        finally:
            await dispatcher.close()
        return small, rows

    small, rows = asyncio.run(scenario())
    assert calls.index("small") <= 2, calls  # FCFS: 50
    np.testing.assert_array_equal(np.concatenate(rows)[:, 0], np.arange(50))
    np.testing.assert_array_equal(small[0], [[0]])

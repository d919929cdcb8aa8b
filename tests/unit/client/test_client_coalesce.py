"""Coalescing in the dispatcher (rose_client/aio.py, coalesce.py): chunks of different jobs
share a call only while they wait for a slot, within the merge's limits; rows go back
by offset; a refused shared call is split so one bad job fails alone."""
import asyncio

import numpy as np
import pytest

from rose_client.aio import AsyncDispatcher, ChunkRefused
from rose_client.aio_stream import Call, ReplicaError
from rose_client.chunking import Chunk, plan_chunks
from rose_client.coalesce import Merge
from rose_client.scheduling import RetryPolicy
from rose_wire import INVALID_ARG, WireError, encode

ONE_TRY = RetryPolicy(max_attempts=1, base_cooldown_s=0.01, max_cooldown_s=0.02, max_unavailable_s=1.0)
MERGE = Merge("m", max_tokens=100, max_texts=100)


class GatedReplica:
    """Answers a Call with its X values as rows [N, 1], once the test opens the call's gate.
    Refuses (INVALID_ARG) a call holding a negative value; `fail_next` fails the next call."""

    def __init__(self, url="r"):
        self.url = url
        self.calls: list[Call] = []
        self.arrived: asyncio.Queue = asyncio.Queue()
        self.gates: list[asyncio.Event] = []
        self.auto_open = False
        self.fail_next = None

    def open_all(self):
        self.auto_open = True
        for gate in self.gates:
            gate.set()

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                gate = asyncio.Event()
                if replica.auto_open:
                    gate.set()
                replica.calls.append(call)
                replica.gates.append(gate)
                replica.arrived.put_nowait(call)
                await gate.wait()
                if replica.fail_next:
                    error, replica.fail_next = replica.fail_next, None
                    raise ReplicaError(url, error)
                x = call.inputs["X"]
                if (x < 0).any():
                    raise ReplicaError(url, encode(WireError(INVALID_ARG, "X holds a negative value", "X")))
                return x.astype(np.float32)[:, None]

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()


def run(scenario):
    """A scenario that waits for a call that never comes fails, not hangs."""
    return asyncio.run(asyncio.wait_for(scenario, 30))


def values(job: int, n: int, bad: bool = False) -> np.ndarray:
    x = np.arange(job * 1000, job * 1000 + n, dtype=np.int64)
    return -x - 1 if bad else x


def submit(dispatcher, job, n=1, merge=MERGE, bad=False, tokens_per_text=1):
    x = values(job, n, bad)
    chunks = plan_chunks([tokens_per_text] * n, 1000, 1000)
    return asyncio.ensure_future(dispatcher.run(
        chunks, lambda c: Call("m", {"X": x[c.start:c.stop]}, "Y", rows=c.num_texts), merge=merge))


def rows_of(parts) -> np.ndarray:
    return np.concatenate(parts)[:, 0]


def sent(call: Call) -> list[int]:
    return call.inputs["X"].tolist()


async def started(replicas, inflight=1, retry=ONE_TRY):
    by_url = {r.url: r for r in replicas}
    dispatcher = AsyncDispatcher(list(by_url), lambda url: by_url[url].slot(url), inflight, retry)
    await dispatcher.start()
    return dispatcher


def test_chunks_merge_only_while_they_wait_and_rows_go_back_by_offset():
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica])
        try:
            first = submit(dispatcher, 1, 2)
            await replica.arrived.get()  # the free slot took it at once, alone
            waiting = [submit(dispatcher, job, n) for job, n in ((2, 3), (3, 1), (4, 2))]
            await asyncio.sleep(0)  # let them queue behind it
            assert len(dispatcher.tasks) == 3
            replica.open_all()
            results = await asyncio.gather(first, *waiting)
        finally:
            await dispatcher.close()
        return replica.calls, results, dispatcher

    calls, results, dispatcher = run(scenario())
    assert [sent(c) for c in calls] == [values(1, 2).tolist(),
                                        values(2, 3).tolist() + values(3, 1).tolist() + values(4, 2).tolist()]
    assert calls[1].rows == 6
    for job, n, parts in zip((1, 2, 3, 4), (2, 3, 1, 2), results):
        np.testing.assert_array_equal(rows_of(parts), values(job, n))
    assert dispatcher.calls == 2 and dispatcher.merged_chunks == 3
    assert dispatcher.tasks.replicas["r"].completed_chunks == 4


def test_free_slots_take_chunks_alone():
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica], inflight=3)
        try:
            jobs = [submit(dispatcher, job) for job in (1, 2, 3)]
            for _ in jobs:
                await replica.arrived.get()
            replica.open_all()
            results = await asyncio.gather(*jobs)
        finally:
            await dispatcher.close()
        return replica.calls, results

    calls, results = run(scenario())
    assert sorted(sent(c) for c in calls) == [values(j, 1).tolist() for j in (1, 2, 3)]
    for job, parts in zip((1, 2, 3), results):
        np.testing.assert_array_equal(rows_of(parts), values(job, 1))


def test_merging_keeps_the_limits_the_keys_and_the_turns():
    """Texts and tokens per call stay within the merge's limits; other keys and jobs
    without a merge never join; the jobs' turn order holds."""
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica])
        small = Merge("m", max_tokens=10, max_texts=3)
        try:
            first = submit(dispatcher, 0, merge=small)
            await replica.arrived.get()
            waiting = [submit(dispatcher, 1, 2, small, tokens_per_text=2),  # 2 texts, 4 tokens
                       submit(dispatcher, 2, 1, Merge("other", 10, 3)),  # another key
                       submit(dispatcher, 3, 1, None),  # no merge (the bulk client's jobs)
                       submit(dispatcher, 4, 1, small, tokens_per_text=5),  # 3 texts, 9 tokens with job 1
                       submit(dispatcher, 5, 1, small, tokens_per_text=1)]  # a 4th text: over max_texts
            await asyncio.sleep(0)
            replica.open_all()
            results = await asyncio.gather(first, *waiting)
        finally:
            await dispatcher.close()
        return replica.calls, results

    calls, results = run(scenario())
    assert [sent(c) for c in calls] == [[0], values(1, 2).tolist() + [4000], [2000], [3000], [5000]]
    for job, n, parts in zip(range(6), (1, 2, 1, 1, 1, 1), results):
        np.testing.assert_array_equal(rows_of(parts), values(job, n))


def test_a_refused_shared_call_fails_only_the_bad_job():
    """The replica refuses the whole shared call for one job's input: each chunk goes
    again alone (no attempt counted: one attempt is all this policy allows)."""
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica])
        try:
            first = submit(dispatcher, 1)
            await replica.arrived.get()
            good, bad, other = submit(dispatcher, 2, 2), submit(dispatcher, 3, 1, bad=True), submit(dispatcher, 4, 3)
            await asyncio.sleep(0)
            replica.open_all()
            results = await asyncio.gather(first, good, bad, other, return_exceptions=True)
        finally:
            await dispatcher.close()
        return replica.calls, results

    calls, (first, good, bad, other) = run(scenario())
    assert len(calls) == 5 and len(sent(calls[1])) == 6  # the shared call, then each alone
    assert sorted(sent(c) for c in calls[2:]) == sorted([values(2, 2).tolist(), values(3, 1, True).tolist(),
                                                         values(4, 3).tolist()])
    assert isinstance(bad, ChunkRefused) and "negative" in str(bad)
    np.testing.assert_array_equal(rows_of(good), values(2, 2))
    np.testing.assert_array_equal(rows_of(other), values(4, 3))


def test_a_failed_shared_call_retries_every_chunk():
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica], retry=RetryPolicy(2, 0.01, 0.02, 60))
        try:
            first = submit(dispatcher, 1)
            await replica.arrived.get()
            waiting = [submit(dispatcher, job, 2) for job in (2, 3)]
            await asyncio.sleep(0)
            replica.gates[0].set()  # job 1 answers; the slot then takes jobs 2 and 3 together
            shared = await replica.arrived.get()
            replica.fail_next = "connection reset"
            replica.open_all()
            results = await asyncio.gather(first, *waiting)
        finally:
            await dispatcher.close()
        return replica.calls, shared, results

    calls, shared, results = run(scenario())
    assert len(sent(shared)) == 4 and len(calls) == 3 and sent(calls[2]) == sent(shared)  # failed, sent again
    for job, n, parts in zip((1, 2, 3), (1, 2, 2), results):
        np.testing.assert_array_equal(rows_of(parts), values(job, n))


def test_a_job_that_leaves_does_not_disturb_the_call_it_shares():
    async def scenario():
        replica = GatedReplica()
        dispatcher = await started([replica])
        try:
            first = submit(dispatcher, 1)
            await replica.arrived.get()
            leaving, staying = submit(dispatcher, 2, 2), submit(dispatcher, 3, 2)
            await asyncio.sleep(0)
            replica.gates[0].set()
            shared = await replica.arrived.get()
            leaving.cancel()
            replica.open_all()
            rows = await staying
            await asyncio.gather(first, leaving, return_exceptions=True)
        finally:
            await dispatcher.close()
        return shared, rows, leaving

    shared, rows, leaving = run(scenario())
    assert len(sent(shared)) == 4 and leaving.cancelled()
    np.testing.assert_array_equal(rows_of(rows), values(3, 2))


def test_merge_refuses_calls_that_differ_beyond_their_rows():
    merge = Merge("k", 10, 10, frozenset({"Q"}))
    a = Call("m", {"Q": np.array([b"q"], dtype=object), "D": np.array([b"x"], dtype=object)}, "S", rows=1)
    b = Call("m", {"Q": np.array([b"other"], dtype=object), "D": np.array([b"y"], dtype=object)}, "S", rows=1)
    c = Call("m", {"Q": np.array([b"q"], dtype=object), "D": np.array([b"z", b"w"], dtype=object)}, "S", rows=2)
    merged = merge.combine([a, c])
    assert merged.inputs["Q"].tolist() == [b"q"] and merged.inputs["D"].tolist() == [b"x", b"z", b"w"]
    assert merged.rows == 3
    with pytest.raises(ValueError, match="differ"):
        merge.combine([a, b])
    with pytest.raises(ValueError, match="differ"):
        merge.combine([a, Call("m", a.inputs, "S", {"dimensions": 2}, rows=1)])
    parts = merge.split(np.arange(3), [1, 2])
    assert [p.tolist() for p in parts] == [[0], [1, 2]]
    assert Chunk(0, 0, 1, 1).num_texts == 1

"""Faults inside a dispatcher slot (rose_client/aio.py): whatever a worker meets, every
job ends (its future resolves), the worker is replaced, and later jobs succeed.

The first test reproduces the wedge of issue 17: a request parameter gRPC cannot
serialise made the call end in a local CancelledError, which killed the worker
and left its job unanswered for good."""
import asyncio

import grpc
import numpy as np
import pytest

from rose_client.aio import AsyncDispatcher, ChunkUnsendable, DispatchFault, JobFailed
from rose_client.aio_stream import AsyncStreamSlot, Call, PayloadError, ReplicaChannel
from rose_client.chunking import plan_chunks
from rose_client.scheduling import RetryPolicy

FAST = RetryPolicy(max_attempts=3, base_cooldown_s=0.01, max_cooldown_s=0.05, max_unavailable_s=0.5)
HANG_GUARD_S = 20  # a job that has not ended by then never will: the test fails instead of hanging


def rows_of(payload):
    start, stop = payload
    return np.arange(start, stop, dtype=np.float32)[:, None]


class Faulty:
    """Replicas whose slots answer `rows_of(payload)`, except the calls `fault(n)` answers with an
    exception to raise (n: how many calls had that payload before, over every job). Counts calls,
    faults, slots made and closed."""

    def __init__(self, fault=lambda n: None):
        self.fault = fault
        self.calls = self.faults = self.slots_made = self.slots_closed = 0
        self.calls_of: dict = {}

    def slot(self, url):
        owner = self
        owner.slots_made += 1

        class Slot:
            async def call(self, payload):
                owner.calls += 1
                n = owner.calls_of[payload] = owner.calls_of.get(payload, -1) + 1
                await asyncio.sleep(0)
                error = owner.fault(n)
                if error is not None:
                    owner.faults += 1
                    raise error
                return rows_of(payload)

            async def is_ready(self):
                return True

            async def close(self):
                owner.slots_closed += 1

        return Slot()


async def run_jobs(dispatcher, num_jobs, num_texts=12, payload_of=lambda c: (c.start, c.stop)):
    chunks = plan_chunks([1] * num_texts, max_chunk_tokens=4, max_chunk_texts=100)
    jobs = [dispatcher.run(chunks, payload_of) for _ in range(num_jobs)]
    return await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), HANG_GUARD_S)


def assert_rows(parts, num_texts=12):
    assert not isinstance(parts, BaseException), parts
    np.testing.assert_array_equal(np.concatenate(parts)[:, 0], np.arange(num_texts))


def live_workers(dispatcher):
    return {url: len(workers) for url, workers in dispatcher._workers.items()}


def scenario(fault, num_jobs=4, urls=("a", "b"), inflight=2):
    """Jobs over replicas with `fault` injected, then (faults off) one more job."""
    replicas = Faulty(fault)

    async def main():
        dispatcher = AsyncDispatcher(list(urls), replicas.slot, inflight, FAST)
        await dispatcher.start()
        try:
            first = await run_jobs(dispatcher, num_jobs)
            blamed = {u: r.consecutive_failures for u, r in dispatcher.tasks.replicas.items()}
            replicas.fault = lambda n: None
            later = await run_jobs(dispatcher, 1)
            workers = live_workers(dispatcher)
        finally:
            await dispatcher.close()
        return first, later[0], workers, blamed

    first, later, workers, blamed = asyncio.run(main())
    assert_rows(later)  # the dispatcher still serves
    assert workers == {u: inflight for u in urls}  # as many live workers as at the start
    return first, blamed, replicas


FAULTS = {
    "locally cancelled call": lambda: asyncio.CancelledError(),  # what grpc.aio raises for a call it cancelled
    "bug in the slot": lambda: KeyError("oops"),
    "runtime error": lambda: RuntimeError("stream in a bad state"),
    "unexpected grpc error": lambda: grpc.aio.UsageError("misused"),
}


@pytest.mark.parametrize("kind", FAULTS)
def test_a_fault_now_and_then_is_retried_and_every_job_succeeds(kind):
    """Every chunk's call faults now and then (never twice running): those chunks go again,
    on a fresh slot; nothing is lost or doubled."""
    first, blamed, replicas = scenario(lambda n: FAULTS[kind]() if n % 3 == 1 else None)
    for parts in first:
        assert_rows(parts)
    assert replicas.faults >= 4 and replicas.slots_made == 4 + replicas.faults  # a fresh slot per fault
    assert blamed == {"a": 0, "b": 0}  # a fault of this process does not make a replica rest


@pytest.mark.parametrize("kind", FAULTS)
def test_a_fault_on_every_attempt_fails_the_job_with_a_named_error(kind):
    first, _, replicas = scenario(lambda n: FAULTS[kind](), num_jobs=5)
    assert all(isinstance(result, DispatchFault) for result in first), first
    assert "failed 3 times" in str(first[0])
    assert replicas.slots_made == 4 + replicas.faults  # each faulted slot was dropped, not reused


def test_a_payload_that_cannot_be_sent_fails_at_once_and_is_not_retried():
    first, blamed, replicas = scenario(lambda n: PayloadError("parameter 'dimensions' does not fit int64"),
                                       num_jobs=2)
    assert all(isinstance(result, ChunkUnsendable) for result in first), first
    assert "does not fit int64" in str(first[0]) and blamed == {"a": 0, "b": 0}
    assert replicas.slots_made == 4  # not retried, and the slots stay in use


def test_a_payload_that_fails_to_build_fails_only_its_job():
    replicas = Faulty()

    def payload_of(chunk):
        if chunk.index == 1:
            raise OverflowError("Python int too large to convert to C long")
        return chunk.start, chunk.stop

    async def main():
        dispatcher = AsyncDispatcher(["a"], replicas.slot, 2, FAST)
        await dispatcher.start()
        try:
            bad = await run_jobs(dispatcher, 2, payload_of=payload_of)
            good = await run_jobs(dispatcher, 1)
        finally:
            await dispatcher.close()
        return bad, good[0]

    bad, good = asyncio.run(main())
    assert all(isinstance(r, ChunkUnsendable) and "chunk 1" in str(r) and "too large" in str(r) for r in bad), bad
    assert_rows(good)


def test_a_worker_that_crashes_outside_a_call_is_replaced():
    """The slot cannot even be made, or its health probe raises: the chunk held is answered."""
    made = {"n": 0}
    replicas = Faulty()

    def slot_factory(url):
        made["n"] += 1
        if made["n"] <= 2:
            raise OSError("no channel")
        slot = replicas.slot(url)
        if made["n"] == 3:
            async def broken_probe():
                raise RuntimeError("probe exploded")
            slot.is_ready = broken_probe
        return slot

    async def main():
        dispatcher = AsyncDispatcher(["a"], slot_factory, 2, FAST)
        dispatcher.tasks.replicas["a"].consecutive_failures = 1  # so the first take probes the slot
        await dispatcher.start()
        try:
            results = await run_jobs(dispatcher, 3)
            workers = live_workers(dispatcher)
        finally:
            await dispatcher.close()
        return results, workers

    results, workers = asyncio.run(main())
    for parts in results:
        assert_rows(parts)
    assert workers == {"a": 2} and made["n"] >= 4  # 3 crashed, each replaced (the last may be waiting to start)


def test_closing_ends_every_job_in_flight_or_queued():
    async def main():
        gate = asyncio.Event()
        replicas = Faulty()
        slot = replicas.slot

        def gated(url):
            s = slot(url)
            answer = s.call

            async def call(payload):
                await gate.wait()
                return await answer(payload)
            s.call = call
            return s

        dispatcher = AsyncDispatcher(["a"], gated, 2, FAST)
        await dispatcher.start()
        chunks = plan_chunks([1] * 12, 4, 100)
        jobs = [asyncio.ensure_future(dispatcher.run(chunks, lambda c: (c.start, c.stop))) for _ in range(3)]
        while dispatcher.inflight["a"] < 2:  # both slots hold a chunk
            await asyncio.sleep(0)
        await dispatcher.close()
        results = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), HANG_GUARD_S)
        with pytest.raises(JobFailed, match="closed"):
            await dispatcher.run(chunks, lambda c: (c.start, c.stop))
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, JobFailed) and "closed" in str(r) for r in results), results


def test_a_dropped_replica_finishes_its_chunks_in_flight():
    """DNS no longer lists a replica: the chunk it holds is not cancelled but answered there;
    the replica counts as drained only once that call has ended."""
    async def main():
        gate = asyncio.Event()
        started = asyncio.Event()
        replicas = Faulty()

        def slot_factory(url):
            s = replicas.slot(url)
            answer = s.call

            async def call(payload):
                if url == "a":
                    started.set()
                    await gate.wait()
                return await answer(payload)
            s.call = call
            return s

        dispatcher = AsyncDispatcher(["a"], slot_factory, 1, FAST)
        await dispatcher.start()
        chunks = plan_chunks([1] * 8, 4, 100)  # two chunks
        job = asyncio.ensure_future(dispatcher.run(chunks, lambda c: (c.start, c.stop)))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        dispatcher.set_replicas(["b"])
        draining = dispatcher.has_workers("a") and dispatcher.inflight.get("a") == 1
        gate.set()
        parts = await asyncio.wait_for(job, HANG_GUARD_S)
        while dispatcher.has_workers("a"):
            await asyncio.sleep(0)
        ended = "a" not in dispatcher.inflight
        await dispatcher.close()
        return draining, parts, ended, replicas

    draining, parts, ended, replicas = asyncio.run(main())
    assert draining and ended
    assert_rows(parts, 8)
    assert replicas.calls == 2  # chunk 0 answered on a after the drop, chunk 1 on b: none sent twice


class CancellingStreamClient:
    """tritonclient.grpc.aio's client as it behaves when gRPC cannot serialise a request: the
    stream's call is cancelled locally and reading it raises asyncio.CancelledError."""

    def __init__(self, cancel_every_call):
        self.cancel_every_call = cancel_every_call

    def stream_infer(self, requests):
        owner = self

        class Stream:
            async def __anext__(self):
                await requests.__anext__()
                if owner.cancel_every_call:
                    raise asyncio.CancelledError()

                class Result:
                    def as_numpy(self, name):
                        return np.ones((1, 2), dtype=np.float32)

                return Result(), None

            def cancel(self):
                pass

        return Stream()


def test_a_locally_cancelled_grpc_call_fails_the_job_and_the_next_one_succeeds():
    """Issue 17's wedge, with the real slot class: before the fix the worker died and the job's
    future never resolved, so each such request took one slot away for good."""
    async def main():
        channel = ReplicaChannel.__new__(ReplicaChannel)
        channel.url, channel.client, channel.generation, channel.slots = "fake:1", CancellingStreamClient(True), 0, []
        dispatcher = AsyncDispatcher(["fake:1"], lambda url: AsyncStreamSlot(channel), 2, FAST)
        await dispatcher.start()
        call = Call("m", {"X": np.zeros(1, dtype=np.int64)}, "Y", rows=1)
        chunks = plan_chunks([1], 4, 100)
        try:
            failed = await asyncio.wait_for(asyncio.gather(*(dispatcher.run(chunks, lambda c: call)
                                                             for _ in range(5)), return_exceptions=True),
                                            HANG_GUARD_S)
            channel.client.cancel_every_call = False
            rows = await asyncio.wait_for(dispatcher.run(chunks, lambda c: call), HANG_GUARD_S)
        finally:
            await dispatcher.close()
        return failed, rows

    failed, rows = asyncio.run(main())
    assert all(isinstance(r, DispatchFault) and "cancelled locally" in str(r) for r in failed), failed
    assert rows[0].shape == (1, 2)


@pytest.mark.parametrize("parameters, fragment", [
    ({"dimensions": 1 << 63}, "does not fit int64"), ({"dimensions": -(1 << 63) - 1}, "does not fit int64"),
    ({"dimensions": [3]}, "is a list")])
def test_the_slot_refuses_a_parameter_grpc_cannot_carry_before_sending(parameters, fragment):
    async def main():
        channel = ReplicaChannel.__new__(ReplicaChannel)
        channel.url, channel.client, channel.generation, channel.slots = "fake:1", CancellingStreamClient(False), 0, []
        slot = AsyncStreamSlot(channel)
        with pytest.raises(PayloadError, match=fragment):
            await slot.call(Call("m", {"X": np.zeros(1, dtype=np.int64)}, "Y", parameters, rows=1))
        return slot._responses

    assert asyncio.run(main()) is None  # no stream was opened: nothing went out

"""The dispatcher (rose_client/aio.py) with in-process replicas: several jobs share
one queue and one in-flight bound per replica (the real servers: tests/e2e/test_client_e2e.py)."""
import asyncio
import dataclasses
import re

import numpy as np
import pytest

from rose_client.aio import AsyncDispatcher, ChunkRefused, JobFailed
from rose_client.aio_stream import ReplicaError
from rose_client.chunking import plan_chunks
from rose_client.scheduling import RetryPolicy
from rose_wire import INVALID_ARG, UNAVAILABLE, WireError, encode

FAST = RetryPolicy(max_attempts=3, base_cooldown_s=0.01, max_cooldown_s=0.05, max_unavailable_s=0.5)
# For tests that count attempts: no unavailability window a stalled machine could run out
PATIENT = dataclasses.replace(FAST, max_unavailable_s=60)


class FakeReplica:
    """Answers a payload (start, stop) with rows [start..stop); can die after some calls."""

    def __init__(self, url, die_after=None, error="connection refused", delay=0.002):
        self.url, self.die_after, self.error, self.delay = url, die_after, error, delay
        self.calls, self.failures, self.active, self.max_active = 0, 0, 0, 0

    @property
    def dead(self):
        return self.die_after is not None and self.calls >= self.die_after

    def slot(self):
        replica = self

        class Slot:
            async def call(self, payload):
                if replica.dead:
                    replica.failures += 1
                    raise ReplicaError(replica.url, replica.error)
                replica.calls += 1
                replica.active += 1
                replica.max_active = max(replica.max_active, replica.active)
                await asyncio.sleep(replica.delay)
                replica.active -= 1
                start, stop = payload
                return np.arange(start, stop, dtype=np.float32)[:, None]

            async def is_ready(self):
                return not replica.dead

            async def close(self):
                pass

        return Slot()


async def run_jobs(replicas, num_jobs=3, num_texts=120, inflight=3, retry=FAST):
    by_url = {r.url: r for r in replicas}
    dispatcher = AsyncDispatcher(list(by_url), lambda url: by_url[url].slot(), inflight, retry)
    await dispatcher.start()
    try:
        chunks = plan_chunks([1] * num_texts, max_chunk_tokens=7, max_chunk_texts=100)
        results = await asyncio.gather(*(dispatcher.run(chunks, lambda c: (c.start, c.stop))
                                         for _ in range(num_jobs)), return_exceptions=True)
    finally:
        await dispatcher.close()
    return chunks, results, dispatcher


def assert_rows_in_order(results, num_texts):
    for parts in results:
        assert not isinstance(parts, BaseException), parts
        np.testing.assert_array_equal(np.concatenate(parts)[:, 0], np.arange(num_texts))


def test_jobs_share_the_replicas_within_the_inflight_bound():
    replicas = [FakeReplica("a"), FakeReplica("b")]
    chunks, results, dispatcher = asyncio.run(run_jobs(replicas, inflight=3))
    assert_rows_in_order(results, 120)
    assert all(r.calls > 0 and r.max_active <= 3 for r in replicas)
    assert sum(r.completed_chunks for r in dispatcher.tasks.replicas.values()) == 3 * len(chunks)


def test_dead_replica_loses_and_duplicates_nothing():
    dying, healthy = FakeReplica("dying", die_after=4), FakeReplica("healthy")
    chunks, results, dispatcher = asyncio.run(run_jobs([dying, healthy]))
    assert_rows_in_order(results, 120)
    state = dispatcher.tasks.replicas
    assert state["dying"].completed_chunks == 4
    assert state["healthy"].completed_chunks == 3 * len(chunks) - 4
    # once down, the dying replica is probed, not handed chunks: few chunk attempts fail there
    assert 1 <= state["dying"].failed_chunks <= 3


def test_input_refusal_fails_only_that_job_and_at_once():
    refusing = FakeReplica("a", die_after=0, error=encode(WireError(INVALID_ARG, "bad ids", "INPUT_IDS")))

    async def scenario():
        good = FakeReplica("b")
        by_url = {"a": refusing, "b": good}
        dispatcher = AsyncDispatcher(["a", "b"], lambda url: by_url[url].slot(), 1, FAST)
        await dispatcher.start()
        chunks = plan_chunks([1] * 4, 10, 100)
        try:
            with pytest.raises(ChunkRefused, match=r"chunk 0 \(texts 0\.\.3\) was refused: .*bad ids"):
                # only replica a takes work until it refuses
                dispatcher.tasks.replicas["b"].cooldown_until = float("inf")
                await dispatcher.run(chunks, lambda c: (c.start, c.stop))
            dispatcher.tasks.replicas["b"].cooldown_until = 0
            refusing.error = "connection refused"
            parts = await dispatcher.run(chunks, lambda c: (c.start, c.stop))
        finally:
            await dispatcher.close()
        return parts

    parts = asyncio.run(scenario())
    np.testing.assert_array_equal(np.concatenate(parts)[:, 0], np.arange(4))


def test_a_refused_chunk_is_not_retried_on_another_replica():
    replicas = [FakeReplica(u, die_after=0,
                            error=encode(WireError(INVALID_ARG, "TEXT[0] is empty or only whitespace", "TEXT")))
                for u in "ab"]
    _, results, _ = asyncio.run(run_jobs(replicas, num_jobs=1, num_texts=4))
    assert isinstance(results[0], ChunkRefused) and "TEXT[0] is empty" in str(results[0])
    assert sum(r.failures for r in replicas) == 1


def test_overload_everywhere_fails_with_the_overload_as_last_error():
    replicas = [FakeReplica(u, die_after=0, error=encode(WireError(UNAVAILABLE, "queue full"))) for u in "ab"]
    by_url = {r.url: r for r in replicas}

    async def scenario():
        def slot(url):
            s = by_url[url].slot()
            s.is_ready = lambda: asyncio.sleep(0, True)  # up, but refusing work
            return s

        dispatcher = AsyncDispatcher(list(by_url), slot, 2, PATIENT)
        await dispatcher.start()
        try:
            with pytest.raises(JobFailed) as info:
                await dispatcher.run(plan_chunks([1] * 4, 2, 100), lambda c: (c.start, c.stop))
        finally:
            await dispatcher.close()
        return info.value

    error = asyncio.run(scenario())
    assert re.search(r"chunk \d \(texts \d\.\.\d\) failed 3 times", str(error)) and error.last_error.overloaded


def test_no_replica_answering_fails_in_bounded_time():
    replicas = [FakeReplica("a", die_after=0), FakeReplica("b", die_after=0)]
    _, results, _ = asyncio.run(run_jobs(replicas, num_jobs=1))
    assert isinstance(results[0], JobFailed) and "no replica answered" in str(results[0])


def test_replicas_can_change_while_running():
    async def scenario():
        replicas = {u: FakeReplica(u) for u in "abc"}
        dispatcher = AsyncDispatcher(["a"], lambda url: replicas[url].slot(), 2, FAST)
        await dispatcher.start()
        chunks = plan_chunks([1] * 50, 5, 100)
        try:
            first = await dispatcher.run(chunks, lambda c: (c.start, c.stop))
            dispatcher.set_replicas(["b", "c"])
            second = await dispatcher.run(chunks, lambda c: (c.start, c.stop))
        finally:
            await dispatcher.close()
        return replicas, first, second

    replicas, first, second = asyncio.run(scenario())
    assert_rows_in_order([first, second], 50)
    assert replicas["a"].calls == 10 and replicas["b"].calls + replicas["c"].calls == 10


class FakeStreamClient:
    """Stands in for tritonclient.grpc.aio's client: each stream answers requests in order
    until it is broken, then raises a gRPC error on its next read."""

    def __init__(self):
        self.streams = []

    def stream_infer(self, requests):
        import grpc

        client = self

        class Stream:
            broken, cancelled = False, False

            def __init__(self):
                client.streams.append(self)

            async def __anext__(self):
                await requests.__anext__()
                if self.broken:
                    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "Socket closed")

                class Result:
                    def as_numpy(self, name):
                        return np.full((1, 2), len(client.streams), dtype=np.float32)

                return Result(), None

            def cancel(self):
                self.cancelled = True

        return Stream()


def test_a_broken_stream_makes_every_slot_of_that_replica_reopen():
    """After a server restart all idle streams to it are dead: the first slot to see
    it marks the replica's streams stale, so the others reopen instead of failing too."""
    from rose_client.aio_stream import AsyncStreamSlot, Call, ReplicaChannel

    async def scenario():
        channel = ReplicaChannel.__new__(ReplicaChannel)
        channel.url, channel.client, channel.generation, channel.slots = "fake:1", FakeStreamClient(), 0, []
        slots = [AsyncStreamSlot(channel) for _ in range(3)]
        call = Call("m", {"X": np.zeros(1, dtype=np.int64)}, "Y", rows=1)
        for slot in slots:
            await slot.call(call)
        for stream in channel.client.streams:
            stream.broken = True  # the server went away
        with pytest.raises(ReplicaError, match="UNAVAILABLE"):
            await slots[0].call(call)
        rows = [await slot.call(call) for slot in slots[1:]]
        return channel.client.streams, rows

    streams, rows = asyncio.run(scenario())
    assert len(streams) == 5 and all(s.cancelled for s in streams[:3])  # three old, two reopened
    assert [r.shape for r in rows] == [(1, 2), (1, 2)]


def test_idle_streams_close_when_the_replica_stops_being_ready():
    """A stopping Triton waits for open streams; the gateway closes the ones no call uses."""
    from rose_client.aio_stream import AsyncStreamSlot, Call, ReplicaChannel

    async def scenario():
        channel = ReplicaChannel.__new__(ReplicaChannel)
        channel.url, channel.client, channel.generation, channel.slots = "fake:1", FakeStreamClient(), 0, []
        idle, busy = AsyncStreamSlot(channel), AsyncStreamSlot(channel)
        call = Call("m", {"X": np.zeros(1, dtype=np.int64)}, "Y", rows=1)
        await idle.call(call)
        await busy.call(call)
        busy.busy = True  # as if a call were in flight on it
        channel.drop_idle_streams()
        return channel.client.streams

    streams = asyncio.run(scenario())
    assert [s.cancelled for s in streams] == [True, False]


def test_a_slot_stays_registered_after_a_failed_call_so_its_next_stream_is_dropped_too():
    """A call answered with an error drops that slot's stream; the slot's next call opens a new
    one, which drop_idle_streams (a stopping replica) must still close: the slot stays in the
    channel's list (it used to leave it, and its new stream then held a stopping Triton open)."""
    from rose_client.aio_stream import AsyncStreamSlot, Call, ReplicaChannel

    class FailingOnce(FakeStreamClient):
        fail_next = True

        def stream_infer(self, requests):
            stream = super().stream_infer(requests)
            answer = stream.__anext__

            async def first_fails():
                result, error = await answer()
                if self.fail_next:
                    self.fail_next = False

                    class Error:
                        def message(self):
                            return "invalid input"
                    return None, Error()
                return result, error

            stream.__anext__ = first_fails
            return stream

    async def scenario():
        channel = ReplicaChannel.__new__(ReplicaChannel)
        channel.url, channel.client, channel.generation, channel.slots = "fake:1", FailingOnce(), 0, []
        slot = AsyncStreamSlot(channel)
        call = Call("m", {"X": np.zeros(1, dtype=np.int64)}, "Y", rows=1)
        with pytest.raises(ReplicaError, match="invalid input"):
            await slot.call(call)
        await slot.call(call)  # a new stream
        registered = slot in channel.slots
        channel.drop_idle_streams()
        return registered, channel.client.streams

    registered, streams = asyncio.run(scenario())
    assert registered and len(streams) == 2 and all(s.cancelled for s in streams)


@pytest.mark.parametrize("workers, background", [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)])
def test_a_background_job_holds_at_most_half_of_a_replicas_slots(workers, background):
    """A background job (the gateway's batch jobs) holds at most half of a replica's slots (at least
    one); the live jobs sent while it holds them all run at once on the other slots, none queued
    behind another, while the background job's chunks wait."""
    background_gate, live_gate = asyncio.Event(), asyncio.Event()
    held: dict[str, list[int]] = {"background": [], "live": []}  # chunks waiting at their gate

    class GatedReplica(FakeReplica):
        def slot(self):
            inner = super().slot()

            class Slot:
                async def call(self, payload):
                    kind, start, stop = payload
                    held[kind].append(start)
                    await (background_gate if kind == "background" else live_gate).wait()
                    return await inner.call((start, stop))

                async def close(self):
                    pass

            return Slot()

    async def settle():
        for _ in range(100):  # a slot free to take a queued chunk would have taken it by now
            await asyncio.sleep(0)

    async def scenario():
        replica = GatedReplica("a")
        dispatcher = AsyncDispatcher(["a"], lambda url: replica.slot(), workers, FAST)
        await dispatcher.start()
        try:
            chunks = plan_chunks([1] * 10, max_chunk_tokens=1, max_chunk_texts=1)
            background_job = asyncio.ensure_future(
                dispatcher.run(chunks, lambda c: ("background", c.start, c.stop), background=True))
            await settle()
            assert len(held["background"]) == background
            live_jobs = [asyncio.ensure_future(dispatcher.run([chunk], lambda c: ("live", c.start, c.stop)))
                         for chunk in chunks[:workers]]
            await settle()
            assert len(held["live"]) == workers - background  # every other slot took a live chunk
            assert len(held["background"]) == background
            live_gate.set()
            if workers > background:  # the live jobs end while the background job still holds its slots
                await asyncio.wait_for(asyncio.gather(*live_jobs), 10)
                assert len(held["background"]) == background and not background_job.done()
            background_gate.set()
            return await asyncio.gather(*live_jobs), await background_job
        finally:
            await dispatcher.close()

    live, rows = asyncio.run(scenario())
    np.testing.assert_array_equal(np.concatenate([np.concatenate(job) for job in live])[:, 0], np.arange(workers))
    np.testing.assert_array_equal(np.concatenate(rows)[:, 0], np.arange(10))

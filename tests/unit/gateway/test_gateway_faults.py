"""The gateway under faults, with in-process fake replicas: a request that fails inside the
gateway is answered (500) and leaves the dispatcher whole; the end-to-end deadline (504);
the health and DNS loops outlive their own exceptions; a replica DNS drops drains."""
import asyncio

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.engine.backend import Backend
from gateway.metrics import GatewayMetrics
from rose_client.aio import AsyncDispatcher
from rose_client.aio_stream import Call
from rose_client.chunking import plan_chunks
from rose_wire import EMBEDDINGS, INPUT_IDS, ROSE_ENCODER, SEQ_LENS
from testing.gateway_app import FAST, gateway_client

MODEL = "all-MiniLM-L6-v2"
HANG_GUARD_S = 30  # past this the thing awaited will never happen: the test fails instead of hanging



class Replica:
    """Answers rows of 4 floats per sequence; `fault()` returns an exception to raise instead,
    or None; `gate` (an asyncio.Event) holds every call until it is set."""

    def __init__(self, fault=lambda: None, gate=None):
        self.fault, self.gate, self.calls = fault, gate, 0

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                replica.calls += 1
                if replica.gate is not None:
                    await replica.gate.wait()
                await asyncio.sleep(0)
                error = replica.fault()
                if error is not None:
                    raise error
                return np.ones((len(call.inputs[SEQ_LENS]), 4), dtype=np.float32)

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()


async def serve(replica, scenario, **config):
    async with gateway_client(replica.slot, **config) as (client, app):
        return await asyncio.wait_for(scenario(client, app.state.gateway), HANG_GUARD_S)


def embed(client, text="x"):
    return client.post("/v1/embeddings", json={"model": MODEL, "input": text})


@pytest.mark.parametrize("fault", [asyncio.CancelledError, lambda: KeyError("bug")])
def test_requests_failing_inside_the_gateway_get_500_and_the_gateway_keeps_serving(fault):
    """Issue 17's wedge in-process: each such request used to kill a slot worker and hang."""
    replica = Replica(fault)

    async def scenario(client, gw):
        failed = await asyncio.gather(*(embed(client) for _ in range(5)))
        replica.fault = lambda: None
        return failed, await embed(client), gw.pending_tokens

    failed, good, pending = asyncio.run(serve(replica, scenario))
    assert [r.status_code for r in failed] == [500] * 5
    error = failed[0].json()["error"]
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert "fake:1" not in error["message"] and "KeyError" not in error["message"]  # details stay in the log
    assert good.status_code == 200 and len(good.json()["data"]) == 1 and pending == 0


def test_a_request_past_its_deadline_is_504_and_its_chunks_are_dropped():
    async def scenario(client, gw):
        replica.gate = asyncio.Event()
        late = await embed(client, ["held"] * 3)
        pending = gw.pending_tokens
        replica.gate.set()
        return late, pending, await embed(client)

    replica = Replica()
    late, pending, good = asyncio.run(serve(replica, scenario, request_timeout_s=0.5, max_chunk_texts=1))
    assert late.status_code == 504
    assert late.json()["error"] == {"message": "the request did not finish within 0.5 s", "type": "timeout",
                                    "param": None, "code": "request_timeout"}
    assert pending == 0 and good.status_code == 200
    # Before its deadline the held request had at most the dispatcher's two slots (one, were the
    # machine stalled past the deadline before the second was sent); its third chunk, queued at
    # the deadline, was dropped, not sent once the gate opened ahead of the good request's call.
    held_calls = replica.calls - 1
    assert 1 <= held_calls <= 2


class FakeChannel:
    def __init__(self):
        self.checked = asyncio.Event()
        self.closed = asyncio.Event()

    async def is_ready(self, model=None, timeout=2.0):
        self.checked.set()
        return True

    def drop_idle_streams(self):
        pass

    async def close(self):
        self.closed.set()


def backend_with(urls, slot_factory, channels, **config):
    """A Backend over `urls` whose channels are the FakeChannels `channels` (url -> channel),
    each opened when the backend first asks for it, as real ones are."""
    backend = Backend(GatewayConfig(**config), GatewayMetrics())
    backend.dispatcher = AsyncDispatcher(urls, slot_factory, 1, FAST)
    backend._channel = lambda url: backend.channels.setdefault(url, channels[url])
    return backend


def test_the_health_and_dns_loops_survive_their_exceptions():
    async def main():
        channels = {"a:1": FakeChannel(), "b:1": FakeChannel()}
        backend = backend_with(["a:1"], Replica().slot, channels, triton=("dns:///replicas:1",),
                               health_interval_s=0.01, dns_refresh_s=0.01)
        rounds = {"health": 0, "dns": 0}
        check_health = backend._check_health

        async def flaky_health():
            rounds["health"] += 1
            if rounds["health"] <= 2:
                raise RuntimeError("health probe broke")
            await check_health()

        async def flaky_resolve():
            rounds["dns"] += 1
            if rounds["dns"] <= 2:
                raise RuntimeError("resolver broke")  # not the OSError/ValueError a lookup raises
            return ["b:1"]

        await backend.dispatcher.start()
        await backend._check_health()  # as Backend.start does
        backend._check_health, backend._resolve = flaky_health, flaky_resolve
        loops = [asyncio.create_task(backend._health_loop()), asyncio.create_task(backend._dns_loop())]
        try:
            await asyncio.wait_for(channels["b:1"].checked.wait(), HANG_GUARD_S)  # refreshed, then checked
            alive = not any(loop.done() for loop in loops)
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await backend.dispatcher.close()
        return alive, backend.dispatcher.urls, rounds

    alive, urls, rounds = asyncio.run(main())
    assert alive and urls == ["b:1"] and rounds["health"] > 2 and rounds["dns"] > 2


def test_a_replica_dns_drops_finishes_its_chunk_before_its_channel_closes():
    async def main():
        gate = asyncio.Event()
        held = Replica(gate=gate)
        slots = {"a:1": held, "b:1": Replica()}
        a, b = FakeChannel(), FakeChannel()
        backend = backend_with(["a:1"], lambda url: slots[url].slot(url), {"a:1": a, "b:1": b},
                               triton=("dns:///replicas:1",), health_interval_s=0.01, dns_refresh_s=0.01)

        async def resolve():
            return ["b:1"] if held.calls else ["a:1"]  # a leaves once it holds a chunk

        backend._resolve = resolve
        await backend.dispatcher.start()
        await backend._check_health()  # as Backend.start does: a's channel is open
        loops = [asyncio.create_task(backend._health_loop()), asyncio.create_task(backend._dns_loop())]
        try:
            one_token = {INPUT_IDS: np.zeros(1, dtype=np.int64), SEQ_LENS: np.ones(1, dtype=np.int64)}
            job = asyncio.ensure_future(backend.dispatcher.run(
                plan_chunks([1, 1], 1, 1), lambda chunk: Call(ROSE_ENCODER, one_token, EMBEDDINGS, rows=1)))
            await asyncio.wait_for(b.checked.wait(), HANG_GUARD_S)  # a was dropped, a health round ran since
            closed_while_busy = a.closed.is_set()
            gate.set()
            rows = await asyncio.wait_for(job, HANG_GUARD_S)
            await asyncio.wait_for(a.closed.wait(), HANG_GUARD_S)  # drained: now it closes
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await backend.dispatcher.close()
        return closed_while_busy, rows, held.calls, slots["b:1"].calls

    closed_while_busy, rows, a_calls, b_calls = asyncio.run(main())
    assert not closed_while_busy
    assert [r.shape for r in rows] == [(1, 4), (1, 4)] and (a_calls, b_calls) == (1, 1)


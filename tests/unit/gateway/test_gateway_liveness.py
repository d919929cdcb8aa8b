"""The gateway's liveness (/livez) and readiness (/health) tell the truth about its own
machinery: a dead loop or dispatcher fails both (a dead slot worker is replaced); Triton down fails readiness only."""
import asyncio

import httpx
import pytest

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.engine.liveness import LIVENESS_PATH
from rose_client.aio import AsyncDispatcher
from rose_client.scheduling import RetryPolicy

REPLICA = "replica-host:8001"


class Slot:
    async def call(self, payload):
        return payload

    async def is_ready(self):
        return True

    async def close(self):
        pass


async def failing_loop():
    raise RuntimeError("a bug in a loop")


def probe(change=None, ready=True):
    """GET /livez and /health after `await change(backend)` -> (livez, health) responses."""
    async def main():
        # Health checks every hour: the loops run, and never reach the (fake) replica during the test.
        app = create_app(GatewayConfig(triton=(REPLICA,), health_interval_s=3600))
        backend = app.state.gateway.backend
        backend.dispatcher = AsyncDispatcher([REPLICA], lambda url: Slot(), 2, RetryPolicy())
        await backend.dispatcher.start()
        backend.ready = {REPLICA: ready}
        backend.loops = [asyncio.create_task(backend._health_loop()), asyncio.create_task(backend._dns_loop())]
        await asyncio.sleep(0)  # the DNS loop returns at once: no dns:/// address to refresh
        assert backend.loops[1].done()
        try:
            if change is not None:
                await change(backend)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
                return await client.get(LIVENESS_PATH), await client.get("/health")
        finally:
            for task in backend.loops:
                task.cancel()
            await backend.dispatcher.close()

    return asyncio.run(main())


def test_live_and_ready_while_everything_runs():
    livez, health = probe()
    assert (livez.status_code, livez.json()) == (200, {"status": "ok"})
    assert health.status_code == 200 and "problems" not in health.json()


def test_triton_down_fails_readiness_not_liveness():
    livez, health = probe(ready=False)
    assert livez.status_code == 200
    assert health.status_code == 503 and health.json()["replicas_ready"] == 0


async def kill_a_worker(backend):
    """The dispatcher replaces a slot worker that ends (rose_client/aio.py): still two, all running."""
    worker = next(iter(backend.dispatcher._workers[REPLICA]))
    worker.cancel()
    await asyncio.gather(worker, return_exceptions=True)
    live = backend.dispatcher._workers[REPLICA]
    assert worker not in live and len(live) == 2 and not any(w.done() for w in live)


async def cancel_the_health_loop(backend):
    backend.loops[0].cancel()
    await asyncio.gather(backend.loops[0], return_exceptions=True)


async def break_a_loop(backend):
    task = asyncio.create_task(failing_loop())
    await asyncio.gather(task, return_exceptions=True)
    backend.loops.append(task)


async def close_the_dispatcher(backend):
    await backend.dispatcher.close()


def test_a_killed_slot_worker_is_replaced_and_the_gateway_stays_live():
    livez, health = probe(kill_a_worker)
    assert livez.status_code == 200 and health.status_code == 200


@pytest.mark.parametrize("change, problem", [
    (cancel_the_health_loop, "the gateway loop Backend._health_loop ended"),
    (break_a_loop, "the gateway loop failing_loop ended"),
    (close_the_dispatcher, "the dispatcher is closed"),
])
def test_dead_machinery_fails_liveness_and_readiness(change, problem):
    livez, health = probe(change)
    assert livez.status_code == 503 and livez.json() == {"status": "failing", "problems": [problem]}
    assert health.status_code == 503 and health.json()["problems"] == [problem]
    assert REPLICA.split(":")[0] not in livez.text + health.text  # the open routes name no replica

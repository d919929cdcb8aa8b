"""The gateway's app in process, its one replica a fake (the gateway's unit tests): no Triton, no sockets."""
from __future__ import annotations

import contextlib

import httpx

from gateway.app import create_app
from gateway.config import GatewayConfig
from rose_client.aio import AsyncDispatcher
from rose_client.scheduling import RetryPolicy

REPLICA = "fake:1"
FAST = RetryPolicy(max_attempts=2, base_cooldown_s=0.01, max_cooldown_s=0.02, max_unavailable_s=0.5)


@contextlib.asynccontextmanager
async def gateway_client(slot, workers: int = 2, retry: RetryPolicy = FAST, ready: bool = True,
                         reranker: bool = False, **config):
    """`(client, app)`: an httpx client on the app built from GatewayConfig(**config), whose dispatcher
    calls `slot(REPLICA)`'s slots with `workers` workers; the replica reads as ready (`ready`) and as
    serving the reranker (`reranker`) without a health check."""
    app = create_app(GatewayConfig(triton=(REPLICA,), **config))
    backend = app.state.gateway.backend
    backend.dispatcher = AsyncDispatcher([REPLICA], slot, workers, retry)
    await backend.dispatcher.start()
    backend.ready, backend.rerank_ready = {REPLICA: ready}, {REPLICA: reranker}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, app
    finally:
        await backend.dispatcher.close()

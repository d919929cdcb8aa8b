"""The ASGI app (Starlette): the route table, one line per endpoint, each to its API
family's handler (gateway/api/) through the plumbing of gateway/http/plumbing.py."""
from __future__ import annotations

import contextlib
import logging
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from .api import admin, cohere, openai, tei
from .config import GatewayConfig
from .engine.liveness import LIVENESS_PATH
from .http.plumbing import Gateway, endpoint, http_error, internal_error

log = logging.getLogger("gateway")


def create_app(config: GatewayConfig) -> Starlette:
    gateway = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.start()
        log.info("gateway ready for %s on %s", gateway.routes.names(), list(config.triton))
        yield
        await gateway.close()

    routes = [
        # a JSON body, read before the request counts against --max-concurrent-requests
        Route("/v1/embeddings", endpoint(gateway, "embeddings", openai.embeddings, limited=True), methods=["POST"]),
        Route("/v1/rerank", endpoint(gateway, "rerank", openai.rerank, limited=True), methods=["POST"]),
        Route("/v2/embed", endpoint(gateway, "embed_v2", cohere.embed, limited=True), methods=["POST"]),
        Route("/embed_sparse", endpoint(gateway, "embed_sparse", tei.embed_sparse, limited=True), methods=["POST"]),
        Route("/v1/models", endpoint(gateway, "models", admin.models), methods=["GET"]),
        Route("/v1/models/{model}", endpoint(gateway, "model", admin.model), methods=["GET"]),
        # probes and metrics: open, no deadline, not counted
        Route("/health", partial(admin.health, gateway), methods=["GET"]),
        Route(LIVENESS_PATH, partial(admin.livez, gateway), methods=["GET"]),
        Route("/metrics", partial(admin.metrics, gateway), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: internal_error})
    app.state.gateway = gateway
    return app

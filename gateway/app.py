"""The ASGI app (Starlette): the route table, one line per endpoint, each to its API
family's handler (gateway/api/) through the plumbing of gateway/http/plumbing.py."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from functools import partial
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from rose_triton.faults import install_fault_gate

from .api import admin, cohere, openai, tei
from .batch.runner import BatchRunner, RunnerSettings
from .batch.store import BatchStore, Limits
from .config import GatewayConfig
from .engine.liveness import LIVENESS_PATH
from .http.inprocess import line_caller
from .http.plumbing import Gateway, endpoint, http_error, internal_error

log = logging.getLogger("gateway")


def create_app(config: GatewayConfig, clock: Callable[[], float] = time.time) -> Starlette:
    """`clock`: the Batch API's (its timestamps and expiry; tests move it)."""
    gateway = Gateway(config)
    batches = batch_store(config, clock)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.start()
        log.info("gateway ready for %s on %s", gateway.routes.names(), list(config.triton))
        runner = batches and asyncio.create_task(batch_runner(gateway, batches).run())
        yield
        if runner:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            batches.close()
        await gateway.close()

    routes = [
        # a JSON body, read before the request counts against --max-concurrent-requests
        Route("/v1/embeddings", endpoint(gateway, "embeddings", openai.embeddings, limited=True), methods=["POST"]),
        Route("/v1/rerank", endpoint(gateway, "rerank", openai.rerank, limited=True), methods=["POST"]),
        Route("/v2/embed", endpoint(gateway, "embed_v2", cohere.embed, limited=True), methods=["POST"]),
        Route("/v1/batches", endpoint(gateway, "batches", openai.create_batch, limited=True), methods=["POST"]),
        Route("/embed_sparse", endpoint(gateway, "embed_sparse", tei.embed_sparse, limited=True), methods=["POST"]),
        Route("/v1/models", endpoint(gateway, "models", admin.models), methods=["GET"]),
        Route("/v1/files", endpoint(gateway, "files", openai.create_file), methods=["POST"]),  # multipart, to disk
        Route("/v1/files", endpoint(gateway, "files", openai.list_files), methods=["GET"]),
        Route("/v1/files/{file_id}", endpoint(gateway, "file", openai.retrieve_file), methods=["GET"]),
        Route("/v1/files/{file_id}", endpoint(gateway, "file", openai.delete_file), methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", endpoint(gateway, "file_content", openai.file_content), methods=["GET"]),
        Route("/v1/batches", endpoint(gateway, "batches", openai.list_batches), methods=["GET"]),
        Route("/v1/batches/{batch_id}", endpoint(gateway, "batch", openai.retrieve_batch), methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", endpoint(gateway, "batch", openai.cancel_batch), methods=["POST"]),
        Route("/v1/models/{model}", endpoint(gateway, "model", admin.model), methods=["GET"]),
        # probes and metrics: open, no deadline, not counted
        Route("/health", partial(admin.health, gateway), methods=["GET"]),
        Route(LIVENESS_PATH, partial(admin.livez, gateway), methods=["GET"]),
        Route("/metrics", partial(admin.metrics, gateway), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: internal_error})
    app.state.gateway = gateway
    app.state.batches = batches
    return app


def batch_store(config: GatewayConfig, clock: Callable[[], float] = time.time) -> BatchStore | None:
    """The Batch API's store under --data-dir (None: off)."""
    if not config.data_dir:
        return None
    try:
        limits = Limits(config.batch_max_file_lines, config.batch_max_file_bytes, config.batch_max_files_per_key,
                        config.batch_max_active_per_key)
        return BatchStore(config.data_dir, limits, clock)
    except (OSError, sqlite3.Error) as exc:
        raise SystemExit(f"gateway: --data-dir {config.data_dir} (ROSE_GATEWAY_DATA_DIR) cannot hold the Batch API's "
                         f"files and jobs: {exc}; set it to a writable folder, or empty to turn the API off") from None


def batch_runner(gateway: Gateway, store: BatchStore) -> BatchRunner:
    """This worker's runner: a line goes to its endpoint's handler, as a live request would."""
    install_fault_gate()  # tests only (ROSE_TEST_FAULTS): holds a job between lines
    config = gateway.config
    call = line_caller(gateway, {"/v1/embeddings": openai.embeddings, "/v2/embed": cohere.embed,
                                 "/v1/rerank": openai.rerank})
    return BatchRunner(store, call, RunnerSettings(config.batch_concurrency, config.batch_lease_s,
                                                   max_body_bytes=config.max_body_bytes))

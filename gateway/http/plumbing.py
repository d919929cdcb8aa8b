"""What every handler uses: the Gateway (settings, routes, backend, bounds) with authorization,
the JSON body, readiness, admission and dispatch to the backend (its failures as statuses);
`json_response`; and `endpoint`, which runs a handler behind the API keys, under the deadline,
with its errors as responses. A handler is `async def name(gateway, request) -> Response`."""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from engine_lib import tracing
from rose_client.aio import ChunkRefused, DispatchFault, JobFailed
from rose_wire import (
    DEFAULT_EMBEDDER,
    DEFAULT_RERANKER,
    DOCUMENTS,
    INPUT_IDS,
    QUERY,
    ROSE_ENCODER,
    SEQ_LENS,
    TEXT,
    TOKEN_TYPE_IDS,
)

from ..config import GatewayConfig, served_model_name
from ..engine.backend import SERVICE, Backend
from .. import stages
from ..engine.routing import EmbedderRoute, RerankerRoute, max_pair_tokens, read_limits, read_routes
from ..engine.tokenizing import GatewayTokenizer, TokenizeQueue
from ..errors import ApiError, bad_request, too_large
from ..metrics import GatewayMetrics
from .bodies import BodyReader
from .connections import ConnectionBounds
from .limits import KeyedRoutes, KeyLimits
from .timing import AccessLog, finish, incoming_trace_id

log = logging.getLogger("gateway")
# The request body's field behind each tensor an encoder may refuse; a refused request
# parameter (dimensions, truncate, ...) has the same name in the body.
BODY_FIELDS = {TEXT: "input", INPUT_IDS: "input", SEQ_LENS: "input", QUERY: "query", DOCUMENTS: "documents",
               TOKEN_TYPE_IDS: "documents"}


def json_response(body, status: int = 200) -> Response:
    return Response(body if isinstance(body, bytes) else orjson.dumps(body), status, media_type="application/json")


class Gateway:
    def __init__(self, config: GatewayConfig):
        self.config = config
        self.tokenizer = GatewayTokenizer(config.tokenizer_config, config.model_dir)
        model_name = served_model_name(config, self.tokenizer.config.model_dir, self.tokenizer.model_dir)
        rerank_limits = read_limits(config.rerank_tokenizer_config)
        self.metrics = GatewayMetrics()
        embedders, rerankers = read_routes(config.models_file, GatewayTokenizer)
        self.routes = KeyedRoutes(EmbedderRoute(model_name, self.tokenizer, DEFAULT_EMBEDDER),
                             RerankerRoute(config.rerank_model_name, rerank_limits, max_pair_tokens(rerank_limits),
                                           DEFAULT_RERANKER),
                             embedders, rerankers, lambda model: self.backend.serves(model))
        self.backend = Backend(config, self.metrics, self.routes.targets())
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")  # /v2/embed's large inputs
        self.tokenize_queues: dict[int, TokenizeQueue] = {}  # per route tokenizer (id): /v1/embeddings' texts
        self.pending_tokens = 0
        self.active_requests = 0  # requests of `limited` endpoints being answered
        self.bodies = BodyReader(config, self.metrics)
        self.connections = ConnectionBounds.from_config(config, self.metrics)
        self.started = time.time()
        self.limits = KeyLimits(config.api_keys, config.keys_file, self.metrics)
        self.access_log = AccessLog(config.access_log)
        tracing.tracer(SERVICE)  # set up now when traces are on (engine_lib/tracing.py); off: nothing loads

    async def start(self) -> None:
        await self.backend.start()

    async def close(self) -> None:
        await self.backend.close()
        for queue in self.tokenize_queues.values():
            queue.close()
        self.pool.shutdown(wait=False)

    def authorize(self, request: Request, record: stages.RequestRecord) -> None:
        """The caller's key (401 without a valid one) on `record` (gateway/http/limits.py)."""
        self.limits.identify(request, record)

    def read_json(self, request: Request) -> dict:
        """The JSON object of the body a `limited` endpoint read."""
        try:
            parsed = orjson.loads(request.state.body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"request body is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise bad_request("request body must be a JSON object")
        stages.mark("parsed")
        return parsed

    def require_ready(self, model: str = ROSE_ENCODER) -> None:
        """Some replica is ready, and serves Triton model `model` (a route's)."""
        if not self.backend.any_ready:
            raise ApiError(503, "no Triton replica is ready", None, "no_replica_ready", retry_after=1)
        if not self.backend.serves(model):
            raise ApiError(503, f"no ready Triton replica serves {model!r}", None, "no_replica_ready", retry_after=1)

    def tokenize_queue(self, tokenizer: GatewayTokenizer) -> TokenizeQueue:
        """The TokenizeQueue of a route's tokenizer: concurrent requests' texts in one batch, off the loop."""
        queue = self.tokenize_queues.get(id(tokenizer))
        if queue is None:
            queue = self.tokenize_queues[id(tokenizer)] = TokenizeQueue(tokenizer)
        return queue

    def admit(self, num_tokens: int, param: str) -> None:
        if num_tokens > self.config.max_pending_tokens:  # it would never pass: not a 429
            raise too_large(f"the request holds {num_tokens} tokens; the gateway admits at most "
                            f"{self.config.max_pending_tokens} at a time: split it", param)
        if self.pending_tokens + num_tokens > self.config.max_pending_tokens:
            raise ApiError(429, f"the gateway holds {self.pending_tokens} tokens in flight; "
                                f"at most {self.config.max_pending_tokens}: retry later", None,
                           "rate_limit_exceeded", retry_after=1)

    async def dispatch(self, request: Request, job, num_tokens: int, param: str = "input"):
        """Run a backend job under the pending-token bound; map its failure to a status.
        If the client leaves first, the job is cancelled: its queued chunks are never sent
        (chunks already in flight finish on their replicas)."""
        try:
            self.admit(num_tokens, param)
            self.limits.charge(num_tokens)
        except ApiError:
            job.close()
            raise
        record = stages.current()
        if record is not None:
            record.tokens, record.dispatched = num_tokens, time.perf_counter()
        self.pending_tokens += num_tokens
        try:
            return await _unless_client_leaves(request, job)
        except ClientLeft:
            self.metrics.disconnects.inc()
            raise ApiError(499, "the client closed the connection before the answer", None,
                           "client_closed_request") from None
        except ChunkRefused as exc:
            field = exc.error.wire.field
            raise bad_request(exc.error.wire.message, BODY_FIELDS.get(field, field) if field else param) from None
        except DispatchFault as exc:  # the gateway's own failure, not a replica's: details in the log only
            log.error("%s failed in the gateway: %s", request.url.path, exc)
            raise ApiError(500, "the gateway failed to send the request to the encoders", None,
                           "internal_error") from None
        except JobFailed as exc:  # its text names replicas and their errors: for the log only
            overloaded = exc.last_error is not None and exc.last_error.overloaded
            log.log(logging.INFO if overloaded else logging.WARNING, "%s %s failed: %s", request.method,
                    request.url.path, exc)
            if overloaded:
                raise ApiError(429, "the encoders are overloaded: retry later", None, "rate_limit_exceeded",
                               retry_after=1) from None
            raise ApiError(503, "no replica could answer the request: retry later", None, "replica_failed",
                           retry_after=1) from None
        finally:
            self.pending_tokens -= num_tokens


Handler = Callable[[Gateway, Request], Awaitable[Response]]


class ClientLeft(Exception):
    pass


async def _unless_client_leaves(request: Request, job):
    """Await `job`; if the HTTP client disconnects first, cancel it and raise ClientLeft.
    The body has been read, so the next ASGI message is the disconnect."""
    work = asyncio.ensure_future(job)
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and gone.result().get("type") == "http.disconnect":
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise ClientLeft()
        return await work
    finally:
        gone.cancel()
        work.cancel()


def endpoint(gateway: Gateway, name: str, handler: Handler, limited: bool = False):
    """`handler` behind the API keys and under the end-to-end deadline (--request-timeout: 504
    past it; its queued chunks are dropped as when the client leaves), its errors as responses,
    with metrics under `name`. `limited`: its body is read first (`_limited`), then it counts
    against --max-concurrent-requests."""
    limit_s = gateway.config.request_timeout_s

    async def run(request: Request) -> Response:
        record = stages.begin()
        if (tracer := tracing.tracer(SERVICE)) is not None:  # traces on (engine_lib/tracing.py)
            from .. import traced

            traced.start(tracer, request.method, request.url.path, request.headers.get("traceparent", ""), record)
        else:
            record.trace_id = incoming_trace_id(request)
        started = record.started
        try:
            async with asyncio.timeout(limit_s) as deadline:
                gateway.authorize(request, record)
                if limited:
                    response = await _limited(gateway, request, handler, record)
                else:
                    response = await handler(gateway, request)
        except ApiError as exc:
            response = exc.response()
        except TimeoutError:
            if deadline.expired():
                response = ApiError(504, f"the request did not finish within {limit_s:g} s", None,
                                    "request_timeout").response()
            else:  # a timeout of something inside: a bug, as below
                log.exception("internal error on %s %s", request.method, request.url.path)
                response = ApiError(500, "internal error").response()
        except Exception:  # a bug: the client learns nothing of it, the log everything
            log.exception("internal error on %s %s", request.method, request.url.path)
            response = ApiError(500, "internal error").response()
        if getattr(request.state, "close_connection", False):
            response.headers["connection"] = "close"
        gateway.metrics.requests.labels(name, str(response.status_code)).inc()
        gateway.metrics.latency.labels(name).observe(time.perf_counter() - started)
        gateway.limits.answered(record, response.status_code)
        finish(request, response, record, gateway.access_log)
        return response
    return run


async def _limited(gateway: Gateway, request: Request, handler: Handler, record: stages.RequestRecord) -> Response:
    """Read the body, count the request against its key's limits (429 past one), then take a slot
    of --max-concurrent-requests (past it 429): a client still sending holds a connection
    (gateway/http/connections.py), never a slot."""
    holds_key_slot = False
    try:
        request.state.body = await gateway.bodies.read(request)
        holds_key_slot = gateway.limits.admit(record)
        if gateway.active_requests >= gateway.config.max_concurrent_requests:
            raise ApiError(429, f"the gateway is answering {gateway.active_requests} requests; at most "
                                f"{gateway.config.max_concurrent_requests}: retry later", None,
                           "rate_limit_exceeded", retry_after=1)
        gateway.active_requests += 1
        gateway.metrics.active_requests.inc()
        try:
            return await handler(gateway, request)
        finally:
            gateway.active_requests -= 1
            gateway.metrics.active_requests.dec()
    finally:
        gateway.bodies.release(request)
        if holds_key_slot:
            gateway.limits.release(record)


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (404 route, 405 method) in the gateway's error JSON."""
    return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()


async def internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return ApiError(500, "internal error").response()

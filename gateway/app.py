"""The ASGI app (Starlette): routes, authentication, error mapping, metrics."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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

from . import cohere, compact, embeddings, rerank
from .http.bodies import BodyReader
from .config import GatewayConfig, served_model_name
from .http.connections import ConnectionBounds
from .errors import ApiError, bad_request, too_large
from .metrics import GatewayMetrics
from .engine import liveness
from .engine.backend import Backend
from .engine.routing import EmbedderRoute, RerankerRoute, Routes, max_pair_tokens, read_limits, read_routes
from .engine.tokenizing import Encoded, GatewayTokenizer, TokenizeQueue

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
        self.model_name = served_model_name(config, self.tokenizer.config.model_dir, self.tokenizer.model_dir)
        self.rerank_limits = read_limits(config.rerank_tokenizer_config)
        self.rerank_pair_tokens = max_pair_tokens(self.rerank_limits)
        self.metrics = GatewayMetrics()
        embedders, rerankers = read_routes(config.models_file, GatewayTokenizer)
        self.routes = Routes(EmbedderRoute(self.model_name, self.tokenizer, DEFAULT_EMBEDDER),
                             RerankerRoute(config.rerank_model_name, self.rerank_limits, self.rerank_pair_tokens,
                                           DEFAULT_RERANKER),
                             embedders, rerankers, lambda model: self.backend.serves(model))
        self.backend = Backend(config, self.metrics, self.routes.targets())
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")  # /v2/embed's large inputs
        self.tokenize_queues: dict[int, TokenizeQueue] = {}  # per route tokenizer (id): /v1/embeddings' texts
        self.pending_tokens = 0
        self.active_requests = 0  # /v1/embeddings and /v1/rerank requests being answered
        self.bodies = BodyReader(config, self.metrics)
        self.connections = ConnectionBounds.from_config(config, self.metrics)
        self.started = time.time()

    def authorize(self, request: Request) -> None:
        if not self.config.api_keys:
            return
        # compared as bytes: the header is any bytes (Starlette reads it as latin-1), a key is UTF-8
        scheme, _, key = request.headers.get("authorization", "").encode("latin-1").partition(b" ")
        if scheme.lower() != b"bearer" or not any(hmac.compare_digest(key.strip(), k.encode())
                                                   for k in self.config.api_keys):
            raise ApiError(401, "missing or invalid API key: send Authorization: Bearer <key>", None,
                           "invalid_api_key")

    async def read_json(self, request: Request) -> dict:
        """The JSON object of the body `_limited` read."""
        try:
            parsed = orjson.loads(request.state.body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"request body is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise bad_request("request body must be a JSON object")
        return parsed

    def require_ready(self, model: str = ROSE_ENCODER) -> None:
        """Some replica is ready, and serves Triton model `model` (a route's)."""
        if not self.backend.any_ready:
            raise ApiError(503, "no Triton replica is ready", None, "no_replica_ready", retry_after=1)
        if not self.backend.serves(model):
            raise ApiError(503, f"no ready Triton replica serves {model!r}", None, "no_replica_ready", retry_after=1)

    def admit(self, num_tokens: int, param: str) -> None:
        if num_tokens > self.config.max_pending_tokens:  # it would never pass: not a 429
            raise too_large(f"the request holds {num_tokens} tokens; the gateway admits at most "
                            f"{self.config.max_pending_tokens} at a time: split it", param)
        if self.pending_tokens + num_tokens > self.config.max_pending_tokens:
            raise ApiError(429, f"the gateway holds {self.pending_tokens} tokens in flight; "
                                f"at most {self.config.max_pending_tokens}: retry later", None,
                           "rate_limit_exceeded", retry_after=1)

    async def embeddings(self, request: Request) -> Response:
        self.authorize(request)
        req = embeddings.parse_request(await self.read_json(request))
        route = self.routes.embedder(req.model)
        embeddings.check_width(req, route.tokenizer.output_dim)
        self.require_ready(route.encoder)
        encoded = await self._encode(req, route.tokenizer)
        num_tokens = int(encoded.seq_lens.sum())
        rows = await self._dispatch(request, self.backend.embed(encoded, req.parameters(num_tokens), route.encoder),
                                    num_tokens)
        self.metrics.tokens.inc(num_tokens)
        self.metrics.inputs.labels("embeddings").inc(req.num_inputs)
        return json_response(embeddings.render_response(rows, route.name, req.encoding_format, num_tokens))

    async def _encode(self, req: embeddings.EmbeddingRequest, tokenizer: GatewayTokenizer | None = None) -> Encoded:
        """`req`'s inputs as ids, with `tokenizer` (its route's; default: the default embedder's)."""
        tokenizer = tokenizer or self.tokenizer
        if req.token_ids is not None:
            return tokenizer.encode_ids(req.token_ids, req.options.truncate, req.options.truncation_direction)
        tokenizer.check_texts(req.texts)
        return await self.tokenize_queue(tokenizer).encode(req.texts, req.options)

    def tokenize_queue(self, tokenizer: GatewayTokenizer) -> TokenizeQueue:
        """The TokenizeQueue of a route's tokenizer: concurrent requests' texts in one batch, off the loop."""
        queue = self.tokenize_queues.get(id(tokenizer))
        if queue is None:
            queue = self.tokenize_queues[id(tokenizer)] = TokenizeQueue(tokenizer)
        return queue

    async def _dispatch(self, request: Request, job, num_tokens: int, param: str = "input"):
        """Run a backend job under the pending-token bound; map its failure to a status.
        If the client leaves first, the job is cancelled: its queued chunks are never sent
        (chunks already in flight finish on their replicas)."""
        try:
            self.admit(num_tokens, param)
        except ApiError:
            job.close()
            raise
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

    async def rerank(self, request: Request) -> Response:
        self.authorize(request)
        body = await self.read_json(request)
        self.require_ready(ROSE_ENCODER)  # which rerankers are served is known from ready replicas
        try:
            route = self.routes.reranker(rerank.requested_model(body))
        except ApiError:  # a bad body is named first (400/413, under the default reranker's limits), then 404
            rerank.parse_request(body, self.routes.default_reranker.limits)
            raise
        req = rerank.parse_request(body, route.limits)
        self.require_ready(route.ensemble)
        scores = await self._dispatch(request, self.backend.rerank(req.query, req.documents, req.parameters,
                                                                   route.ensemble),
                                      rerank.admission_tokens(req, route.pair_tokens), "documents")
        self.metrics.inputs.labels("rerank").inc(len(req.documents))
        return json_response(rerank.render_results(req, scores, route.name))

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        names = self.routes.names()
        data = [{"id": n, "object": "model", "created": int(self.started), "owned_by": "rose"} for n in names]
        return json_response({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        """Readiness: some replica serves the encoder, and the gateway's own machinery runs."""
        ready = sum(self.backend.ready.values())
        problems = liveness.problems(self.backend)
        ok = ready and not problems
        body = {"status": "ok" if ok else "unavailable", "replicas_ready": ready,
                "replicas": len(self.backend.ready), **({"problems": problems} if problems else {})}
        return json_response(body, 200 if ok else 503)

    async def livez(self, request: Request) -> Response:
        """Liveness: the gateway's own machinery runs (whatever Triton does; gateway/engine/liveness.py)."""
        problems = liveness.problems(self.backend)
        return json_response({"status": "failing", "problems": problems} if problems else {"status": "ok"},
                             503 if problems else 200)

    async def prometheus(self, request: Request) -> Response:
        dispatcher = self.backend.dispatcher
        completed = {url: r.completed_chunks for url, r in dispatcher.tasks.replicas.items()}
        text = self.metrics.render(dispatcher.inflight, completed, self.backend.ready, self.pending_tokens, dispatcher)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


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


def _endpoint(gateway: Gateway, name: str, handler, limited: bool = False):
    """`handler` under the end-to-end deadline (--request-timeout: 504 past it; its queued
    chunks are dropped as when the client leaves), with metrics. `limited`: its body is read
    first (`_limited`), then it counts against --max-concurrent-requests."""
    limit_s = gateway.config.request_timeout_s

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(limit_s) as deadline:
                if limited:
                    response = await _limited(gateway, request, handler)
                else:
                    response = await handler(request)
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
        return response
    return run


async def _limited(gateway: Gateway, request: Request, handler) -> Response:
    """Authorize, read the body, then take a slot of --max-concurrent-requests (past it 429):
    a client still sending holds a connection (gateway/http/connections.py), never a slot."""
    gateway.authorize(request)
    try:
        request.state.body = await gateway.bodies.read(request)
        if gateway.active_requests >= gateway.config.max_concurrent_requests:
            raise ApiError(429, f"the gateway is answering {gateway.active_requests} requests; at most "
                                f"{gateway.config.max_concurrent_requests}: retry later", None,
                           "rate_limit_exceeded", retry_after=1)
        gateway.active_requests += 1
        gateway.metrics.active_requests.inc()
        try:
            return await handler(request)
        finally:
            gateway.active_requests -= 1
            gateway.metrics.active_requests.dec()
    finally:
        gateway.bodies.release(request)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return ApiError(500, "internal error").response()


def create_app(config: GatewayConfig) -> Starlette:
    gateway = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gateway.backend.start()
        log.info("gateway ready for %s on %s", gateway.routes.names(), list(config.triton))
        yield
        await gateway.backend.close()
        for queue in gateway.tokenize_queues.values():
            queue.close()
        gateway.pool.shutdown(wait=False)

    routes = [Route("/v1/embeddings", _endpoint(gateway, "embeddings", gateway.embeddings, True), methods=["POST"]),
              Route("/v1/rerank", _endpoint(gateway, "rerank", gateway.rerank, True), methods=["POST"]),
              Route("/v2/embed", _endpoint(gateway, "embed_v2", lambda r: cohere.embed(gateway, r), True),
                    methods=["POST"]),
              Route("/v1/models", _endpoint(gateway, "models", gateway.models), methods=["GET"]),
              Route("/v1/models/{model}", _endpoint(gateway, "model", lambda r: compact.model_object(gateway, r)),
                    methods=["GET"]),
              Route("/health", gateway.health, methods=["GET"]),
              Route(liveness.LIVENESS_PATH, gateway.livez, methods=["GET"]),
              Route("/metrics", gateway.prometheus, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _internal_error})
    app.state.gateway = gateway
    return app

"""The admin routes: GET /v1/models and /v1/models/{model} (OpenAI's model objects; an
embedder's also carries `dimensions` and `int8_ranges`), /health (readiness), /livez
(liveness: gateway/engine/liveness.py) and /metrics (Prometheus)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engine_lib.errors import InputError
from engine_lib.options import check_integer

from ..engine import liveness
from ..errors import bad_request, from_input_error, model_not_found
from ..http.plumbing import Gateway, json_response


async def models(gateway: Gateway, request: Request) -> Response:
    names = gateway.routes.names()
    data = [{"id": n, "object": "model", "created": int(gateway.started), "owned_by": "rose"} for n in names]
    return json_response({"object": "list", "data": data})


async def model(gateway: Gateway, request: Request) -> Response:
    """OpenAI's model object; the embedder's also carries `dimensions` and `int8_ranges`
    [[min_0, ...], [max_0, ...]] (query `?dimensions=N`: those of rows cut to N)."""
    name = request.path_params["model"]
    body = {"id": name, "object": "model", "created": int(gateway.started), "owned_by": "rose"}
    if name not in gateway.routes.embedders:
        if name in gateway.routes.reranker_names():
            return json_response(body)
        raise model_not_found(name, gateway.routes.names())
    route = gateway.routes.embedder(name)
    unknown = sorted(set(request.query_params) - {"dimensions"})
    if unknown:
        raise bad_request(f"unknown query parameter(s) {unknown}; known: ['dimensions']", unknown[0])
    width = route.tokenizer.output_dim
    try:
        dimensions = check_integer("dimensions", request.query_params.get("dimensions", "0"),
                                   maximum=width if width else (1 << 63) - 1)
    except InputError as exc:
        raise from_input_error(exc) from None
    gateway.require_ready(route.encoder)
    ranges = await gateway.dispatch(request, gateway.backend.int8_ranges(dimensions, route.encoder), 1, "model")
    return json_response({**body, "dimensions": int(ranges.shape[1]), "int8_ranges": ranges.tolist()})


async def health(gateway: Gateway, request: Request) -> Response:
    """Readiness: some replica serves the encoder, and the gateway's own machinery runs."""
    ready = sum(gateway.backend.ready.values())
    problems = liveness.problems(gateway.backend)
    ok = ready and not problems
    body = {"status": "ok" if ok else "unavailable", "replicas_ready": ready,
            "replicas": len(gateway.backend.ready), **({"problems": problems} if problems else {})}
    return json_response(body, 200 if ok else 503)


async def livez(gateway: Gateway, request: Request) -> Response:
    """Liveness: the gateway's own machinery runs, whatever Triton does."""
    problems = liveness.problems(gateway.backend)
    return json_response({"status": "failing", "problems": problems} if problems else {"status": "ok"},
                         503 if problems else 200)


async def metrics(gateway: Gateway, request: Request) -> Response:
    dispatcher = gateway.backend.dispatcher
    completed = {url: r.completed_chunks for url, r in dispatcher.tasks.replicas.items()}
    text = gateway.metrics.render(dispatcher.inflight, completed, gateway.backend.ready, gateway.pending_tokens,
                                  dispatcher)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

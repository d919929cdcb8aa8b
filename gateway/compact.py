"""The compact output types through the gateway: several outputs of one request from the
encoders, and the int8 ranges a client needs to de-quantize (GET /v1/models/{model}).

The encoders compute every type (engine_lib/service/outputs.py); the gateway asks
`rose_encoder` for the tensors it needs by name (requested outputs, and the same
list as its `embedding_types` parameter) and puts each type's chunks back in input order."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engine_lib.errors import InputError
from engine_lib.options import check_integer

from .errors import bad_request, from_input_error, model_not_found

async def model_object(gateway, request: Request) -> Response:
    """GET /v1/models/{model}: OpenAI's model object; the embedder's also carries `dimensions` and
    `int8_ranges` [[min_0, ...], [max_0, ...]] (query `?dimensions=N`: those of rows cut to N)."""
    from .app import json_response

    gateway.authorize(request)
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
    ranges = await gateway._dispatch(request, gateway.backend.int8_ranges(dimensions, route.encoder), 1, "model")
    return json_response({**body, "dimensions": int(ranges.shape[1]), "int8_ranges": ranges.tolist()})

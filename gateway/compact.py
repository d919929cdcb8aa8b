"""The compact output types through the gateway: several outputs of one request from the
encoders, and the int8 ranges a client needs to de-quantize (GET /v1/models/{model}).

The encoders compute every type (engine_lib/service/outputs.py); the gateway asks
`rose_encoder` for the tensors it needs by name (requested outputs, and the same
list as its `embedding_types` parameter) and puts each type's chunks back in input order."""
from __future__ import annotations

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from engine_lib.errors import InputError
from engine_lib.options import check_integer
from rose_client.aio_stream import Call
from rose_client.chunking import Chunk, plan_chunks
from rose_wire import INPUT_IDS, INT8_RANGES, OUTPUT_OF_TYPE, ROSE_ENCODER, SEQ_LENS

from .errors import bad_request, from_input_error, model_not_found
from .tokenizing import Encoded

TYPE_OF_OUTPUT = {name: kind for kind, name in OUTPUT_OF_TYPE.items()}


async def embed_types(backend, encoded: Encoded, types: list[str], dimensions: int,
                      encoder: str = ROSE_ENCODER) -> dict[str, np.ndarray]:
    """-> {type: [num_inputs, ...] array in input order} for `types` (keys of rose_wire.OUTPUT_OF_TYPE),
    from Triton model `encoder`."""
    names = tuple(OUTPUT_OF_TYPE[t] for t in dict.fromkeys(types))
    parameters = {"embedding_types": ",".join(TYPE_OF_OUTPUT[n] for n in names),
                  **({"dimensions": dimensions} if dimensions else {})}
    chunks = plan_chunks(encoded.seq_lens.tolist(), backend.config.max_chunk_tokens, backend.config.max_chunk_texts)
    offsets = encoded.offsets

    def call(chunk: Chunk) -> Call:
        ids = encoded.input_ids[offsets[chunk.start]:offsets[chunk.stop]]
        return Call(encoder, {INPUT_IDS: ids, SEQ_LENS: encoded.seq_lens[chunk.start:chunk.stop]},
                    names[0], parameters, rows=chunk.num_texts, outputs=names)

    backend.metrics.chunks.labels("embed_v2").inc(len(chunks))
    parts = await backend.dispatcher.run(chunks, call)
    return {TYPE_OF_OUTPUT[n]: np.concatenate([p[n] for p in parts]) for n in names}


async def fetch_ranges(backend, dimensions: int, encoder: str = ROSE_ENCODER) -> np.ndarray:
    """The served model's int8 ranges [2, D] (D = `dimensions`, 0: all): the encoder answers a
    request for INT8_RANGES alone from its calibration, without running the one token sent."""
    chunks = plan_chunks([1], 1, 1)
    parameters = {"embedding_types": "int8_ranges", **({"dimensions": dimensions} if dimensions else {})}
    sequence = {INPUT_IDS: np.zeros(1, dtype=np.int64), SEQ_LENS: np.ones(1, dtype=np.int64)}
    (ranges,) = await backend.dispatcher.run(chunks, lambda chunk: Call(encoder, sequence, INT8_RANGES,
                                                                        parameters, rows=2))
    return ranges


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
    ranges = await gateway._dispatch(request, fetch_ranges(gateway.backend, dimensions, route.encoder), 1, "model")
    return json_response({**body, "dimensions": int(ranges.shape[1]), "int8_ranges": ranges.tolist()})

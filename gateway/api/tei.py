"""Text Embeddings Inference's routes: POST /embed_sparse (TEI's SPLADE endpoint), on any served
model that gives sparse outputs (engine_lib/retrieval.py: SPLADE, BGE-M3).

Request: `inputs` (a string or a list of strings), `truncate` (default false: an over-long text is a
400, as TEI does; true cuts it), `truncation_direction` (Right, the default, keeps the start; Left
keeps the end), `model` (ours: a served name; left out, the only served model that gives sparse).
Response: `[[{"index": i, "value": v}, ...]]` per input, indices ascending.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.retrieval import SPARSE
from engine_lib.tokenization.text_input import check_texts

from ..engine.retrieval_calls import embed_retrieval, offered_types
from ..errors import bad_request, from_input_error, model_not_found
from ..http.plumbing import Gateway, json_response

FIELDS = {"inputs", "truncate", "truncation_direction", "model"}
DIRECTIONS = {"right": "right", "left": "left"}  # TEI spells them Right / Left


def _sparse_route(gateway: Gateway, model):
    if model is not None:
        if not isinstance(model, str) or not model:
            raise bad_request("'model' must be a string", "model")
        route = gateway.routes.embedder(model)
        if SPARSE not in (offered_types(route.tokenizer.model_dir) or ()):
            raise bad_request(f"model {model!r} cannot give embedding type 'sparse'", "model")
        return route
    names = [name for name, route in gateway.routes.embedders.items()
             if SPARSE in (offered_types(route.tokenizer.model_dir) or ())]
    if len(names) != 1:
        raise model_not_found(None, names, ": name one in 'model'" if names else ": no served model gives sparse")
    return gateway.routes.embedders[names[0]]


async def embed_sparse(gateway: Gateway, request: Request) -> Response:
    body = gateway.read_json(request)
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(FIELDS)}", unknown[0])
    inputs = body.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request("'inputs' is required: a string or a non-empty list of strings", "inputs")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise bad_request(f"'truncate' must be a boolean, got {truncate!r}", "truncate")
    direction = body.get("truncation_direction") or "Right"
    if not isinstance(direction, str) or direction.lower() not in DIRECTIONS:
        raise bad_request(f"'truncation_direction' must be Right or Left, got {direction!r}", "truncation_direction")
    route = _sparse_route(gateway, body.get("model"))
    try:
        check_texts(texts, route.tokenizer.config, "inputs")
    except InputError as exc:
        raise from_input_error(exc) from None
    gateway.require_ready(route.encoder)
    options = RequestOptions(truncate=truncate, truncation_direction=DIRECTIONS[direction.lower()])
    try:
        tokens = route.tokenizer.text.encode(texts, options)
    except InputError as exc:  # truncate false and an over-long text
        raise bad_request(str(exc).replace("TEXT[", "inputs["), "inputs") from None
    num_tokens = int(tokens.seq_lens.sum())
    job = embed_retrieval(gateway.backend, tokens, [SPARSE], {}, route.encoder)
    arrays = await gateway.dispatch(request, job, num_tokens, "inputs")
    gateway.metrics.tokens.inc(num_tokens)
    gateway.metrics.inputs.labels("embed_sparse").inc(len(texts))
    return json_response([[{"index": int(i), "value": float(v)} for i, v in zip(*pair)] for pair in arrays[SPARSE]])

"""POST /v2/embed: Cohere's embed API (v2), for the official `cohere` SDK (`ClientV2(base_url=...)`).

Request: `model`, `texts`, `input_type` (search_query -> our `query` template,
search_document -> `document`, classification / clustering -> the folder's prompts of
those names, else the document template), `embedding_types` (float, int8, uint8,
binary, ubinary, base64; several at once; default float), `output_dimension` (our
`dimensions`), `truncate` (NONE refuses an over-long text with 400, START drops tokens
from its start, END from its end; default END). Response: `id`, `embeddings` keyed by
type, `texts`, `meta.billed_units.input_tokens`. Images, `inputs`, `max_tokens` and
`priority` are refused by name (400). Errors are the gateway's (OpenAI's error JSON).

Retrieval models (engine_lib/retrieval.py: BGE-M3, SPLADE, ColBERT) also give `sparse` (`embeddings.sparse`:
`{"indices", "values"}` per text, indices ascending; `sparse_top_k` keeps each text's largest weights)
and `multivector` (`embeddings.multivector`: a list of token vectors per text), several types in one
encoder call (a ColBERT model: `multivector` only, `input_type` search_query for queries). A type the model cannot give is a 400 naming the model and the type; a multi-vector
request over MAX_MULTIVECTOR_TOKENS tokens is a 413 (each token is a D-float vector in the answer).
"""
from __future__ import annotations

import asyncio
import base64
import uuid
from dataclasses import dataclass

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import RequestOptions, check_integer
from engine_lib.retrieval import MULTIVECTOR, SPARSE
from engine_lib.tokenization.text_input import check_texts

from ..engine.retrieval_calls import embed_retrieval, offered_types
from ..engine.tokenizing import GatewayTokenizer
from ..errors import bad_request, from_input_error, too_large
from ..http.plumbing import Gateway, json_response

INPUT_TYPES = {"search_query": "query", "search_document": "document", "classification": "classification",
               "clustering": "clustering"}
DENSE_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
RAGGED_TYPES = (SPARSE, MULTIVECTOR)
EMBEDDING_TYPES = DENSE_TYPES + RAGGED_TYPES
# Tokens of a request asking for multi-vectors, at most: each becomes a vector of D floats in the
# answer (about 10 bytes of JSON per float: ~10 KiB per token at D = 1024).
MAX_MULTIVECTOR_TOKENS = 16384
TRUNCATE = {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right")}  # -> truncate, direction
FIELDS = {"model", "texts", "input_type", "embedding_types", "output_dimension", "truncate", "sparse_top_k"}
UNSUPPORTED = {"images": "this gateway embeds texts only", "inputs": "send `texts`",
               "max_tokens": "texts are cut at the model's own maximum",
               "priority": "the class follows the request's size here (docs/gateway.md); /v1/embeddings takes one"}
INLINE_CHARS = 16384  # as /v1/embeddings: larger inputs are tokenized in the gateway's pool


async def embed(gateway: Gateway, request: Request) -> Response:
    body = gateway.read_json(request)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "model")
    route = gateway.routes.embedder(model)  # 404 naming the served embedders
    req = parse_embed_request(body, route.tokenizer.output_dim)
    try:
        check_texts(req.texts, route.tokenizer.config, "texts")
    except InputError as exc:
        raise from_input_error(exc) from None
    gateway.require_ready(route.encoder)
    if sum(map(len, req.texts)) <= INLINE_CHARS:
        encoded = _encode(route.tokenizer, req)
    else:
        encoded = await asyncio.get_running_loop().run_in_executor(gateway.pool, _encode, route.tokenizer, req)
    num_tokens = int(encoded.seq_lens.sum())
    types = list(dict.fromkeys("float" if t == "base64" else t for t in req.types))
    check_offered(model, route.tokenizer.model_dir, types)
    if MULTIVECTOR in types and num_tokens > MAX_MULTIVECTOR_TOKENS:
        raise too_large(f"multi-vector outputs for {num_tokens} tokens; at most {MAX_MULTIVECTOR_TOKENS} per "
                        f"request (each token is a vector in the answer): send fewer texts", "texts")
    if any(t in RAGGED_TYPES for t in types) or offered_types(route.tokenizer.model_dir) is not None:
        parameters = {k: v for k, v in (("dimensions", req.options.dimensions),
                                        ("sparse_top_k", req.options.sparse_top_k),
                                        ("input_type", req.options.input_type)) if v}
        job = embed_retrieval(gateway.backend, encoded, types, parameters, route.encoder)
    else:
        job = gateway.backend.embed_types(encoded, types, req.options.dimensions, route.encoder)
    arrays = await gateway.dispatch(request, job, num_tokens, "texts")
    gateway.metrics.tokens.inc(num_tokens)
    gateway.metrics.inputs.labels("embed_v2").inc(len(req.texts))
    return json_response(render_embed(req, arrays, num_tokens))


def check_offered(model: str, model_dir: str, types: list[str]) -> None:
    offered = offered_types(model_dir)
    for kind in types:
        if (kind not in offered) if offered is not None else (kind in RAGGED_TYPES):
            gives = list(offered) if offered is not None else [t for t in DENSE_TYPES if t != "base64"]
            raise bad_request(f"model {model!r} cannot give embedding type {kind!r}; it gives {gives}",
                              "embedding_types")


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    texts: list[str]
    types: tuple[str, ...]
    options: RequestOptions


def parse_embed_request(body: dict, width: int | None) -> EmbedRequest:
    unknown = sorted(set(body) - FIELDS - set(UNSUPPORTED))
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(FIELDS)}", unknown[0])
    for name, why in UNSUPPORTED.items():
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is not supported here: {why}", name)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "model")
    texts = body.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise bad_request("'texts' is required and must be a list of strings", "texts")
    input_type = body.get("input_type") or "search_document"
    if input_type not in INPUT_TYPES:
        raise bad_request(f"'input_type' must be one of {list(INPUT_TYPES)}, got {input_type!r}", "input_type")
    types = body.get("embedding_types") or ["float"]
    if not isinstance(types, list) or not all(isinstance(t, str) and t in EMBEDDING_TYPES for t in types):
        raise bad_request(f"'embedding_types' must be a list of {list(EMBEDDING_TYPES)}, got {types!r}",
                          "embedding_types")
    truncate = body.get("truncate") or "END"
    if not isinstance(truncate, str) or truncate.upper() not in TRUNCATE:
        raise bad_request(f"'truncate' must be one of {list(TRUNCATE)}, got {truncate!r}", "truncate")
    keep, direction = TRUNCATE[truncate.upper()]
    dimensions = body.get("output_dimension")
    try:
        if dimensions is not None:
            dimensions = check_integer("output_dimension", dimensions, 1, width or (1 << 63) - 1, digits=False)
    except InputError as exc:
        raise from_input_error(exc) from None
    top_k = body.get("sparse_top_k")
    try:
        top_k = 0 if top_k is None else check_integer("sparse_top_k", top_k, 1, digits=False)
    except InputError as exc:
        raise from_input_error(exc) from None
    options = RequestOptions(input_type=INPUT_TYPES[input_type], truncate=keep, truncation_direction=direction,
                             dimensions=dimensions or 0, sparse_top_k=top_k)
    return EmbedRequest(model, texts, tuple(dict.fromkeys(types)), options)


def render_embed(req: EmbedRequest, arrays: dict[str, np.ndarray], num_tokens: int) -> bytes:
    embeddings = {}
    for kind in req.types:
        if kind == "base64":  # little-endian float32 bytes of each float row
            embeddings[kind] = [base64.b64encode(r.tobytes()).decode() for r in arrays["float"].astype("<f4")]
        elif kind == SPARSE:
            embeddings[kind] = [{"indices": i, "values": v} for i, v in arrays[kind]]
        else:
            embeddings[kind] = arrays[kind]
    body = {"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": req.texts,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": num_tokens}},
            "response_type": "embeddings_by_type"}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _encode(tokenizer: GatewayTokenizer, req: EmbedRequest) -> RaggedTokens:
    try:
        return tokenizer.text.encode(req.texts, req.options)
    except InputError as exc:  # truncate=NONE and an over-long text
        raise bad_request(str(exc).replace("TEXT[", "texts["), "texts") from None

"""The OpenAI-style routes. POST /v1/embeddings: OpenAI's request fields (plus input_type,
truncate, truncation_direction, chunking and priority) checked one by one, and the response in
float or base64. POST /v1/rerank in the Cohere/Jina shape: query, documents, top_n,
return_documents; results sorted by relevance_score with their index. The options and the text
limits follow the models' own rules (engine_lib/options.py, engine_lib/tokenization/text_input.py).
Compact types are /v2/embed's (gateway/api/cohere.py)."""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from engine_lib.errors import InputError
from engine_lib.options import (
    BATCH,
    INTERACTIVE_MAX_TEXTS,
    PRIORITY_PARAMETER,
    RequestOptions,
    RerankOptions,
    check_integer,
    check_priority,
    default_priority,
)
from engine_lib.retrieval import MULTIVECTOR
from engine_lib.tokenization.text_input import TextLimits, check_texts
from rose_wire import ROSE_ENCODER

from ..engine.retrieval_calls import embed_retrieval, late_interaction_scores, offered_types
from ..engine.tokenizing import Encoded, GatewayTokenizer
from ..errors import ApiError, bad_request, from_input_error
from ..http.plumbing import Gateway, json_response

# the RequestOptions a client sets
EMBEDDING_OPTIONS = ("dimensions", "input_type", "truncate", "truncation_direction", "chunking")
EMBEDDING_FIELDS = {"input", "model", "encoding_format", "user", "priority", *EMBEDDING_OPTIONS}
RERANK_OPTIONS = ("raw_scores", "truncate", "instruction")  # RerankOptions fields, passed on to the reranker
RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "priority", *RERANK_OPTIONS}
PAIR_TEMPLATE_TOKENS = 256  # a pair template's own tokens at most (Qwen3's judge prompt and task: ~100)


async def embeddings(gateway: Gateway, request: Request) -> Response:
    req = parse_embedding_request(gateway.read_json(request))
    route = gateway.routes.embedder(req.model)
    check_width(req, route.tokenizer.output_dim)
    gateway.require_ready(route.encoder)
    encoded = await _encode(gateway, req, route.tokenizer)
    num_tokens = int(encoded.seq_lens.sum())
    rows = await gateway.dispatch(request, gateway.backend.embed(encoded, req.parameters(num_tokens), route.encoder),
                                  num_tokens)
    gateway.metrics.tokens.inc(num_tokens)
    gateway.metrics.inputs.labels("embeddings").inc(req.num_inputs)
    return json_response(render_embeddings(rows, route.name, req.encoding_format, num_tokens))


async def rerank(gateway: Gateway, request: Request) -> Response:
    body = gateway.read_json(request)
    model = body.get("model")
    if isinstance(model, str) and MULTIVECTOR in (offered_types_of(gateway, model) or ()):
        return await _rerank_late_interaction(gateway, request, body, gateway.routes.embedders[model])
    gateway.require_ready(ROSE_ENCODER)  # which rerankers are served is known from ready replicas
    try:
        route = gateway.routes.reranker(requested_model(body))
    except ApiError:  # a bad body is named first (400/413, under the default reranker's limits), then 404
        parse_rerank_request(body, gateway.routes.default_reranker.limits)
        raise
    req = parse_rerank_request(body, route.limits)
    gateway.require_ready(route.ensemble)
    scores = await gateway.dispatch(request, gateway.backend.rerank(req.query, req.documents, req.parameters,
                                                                    route.ensemble),
                                    admission_tokens(req, route.pair_tokens), "documents")
    gateway.metrics.inputs.labels("rerank").inc(len(req.documents))
    return json_response(render_rerank(req, scores, route.name))


def offered_types_of(gateway: Gateway, model: str) -> tuple[str, ...] | None:
    route = gateway.routes.embedders.get(model)
    return None if route is None else offered_types(route.tokenizer.model_dir)


async def _rerank_late_interaction(gateway: Gateway, request: Request, body: dict, route) -> Response:
    """/v1/rerank on a multi-vector embedder (BGE-M3): the query and documents embedded in one call,
    scored here with MaxSim, or with `weights` [dense, sparse, multivector] as FlagEmbedding's compute_score."""
    body = dict(body)
    weights = body.pop("weights", None)
    if weights is not None and (not isinstance(weights, list) or len(weights) != 3 or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights) or not sum(weights)):
        raise bad_request(f"'weights' must be [dense, sparse, multivector]: 3 numbers >= 0, not all 0; got {weights!r}",
                          "weights")
    req = parse_rerank_request(body, route.tokenizer.config)
    gateway.require_ready(route.encoder)
    texts = [req.query, *req.documents]
    encoded = route.tokenizer.encode_texts(texts, RequestOptions(truncate=True))
    types = ["float", "sparse", "multivector"] if weights else ["multivector"]
    outputs = await gateway.dispatch(request, embed_retrieval(gateway.backend, encoded, types, {}, route.encoder),
                                     int(encoded.seq_lens.sum()), "documents")
    gateway.metrics.inputs.labels("rerank").inc(len(req.documents))
    return json_response(render_rerank(req, late_interaction_scores(outputs, weights), route.name))


async def _encode(gateway: Gateway, req: EmbeddingRequest, tokenizer: GatewayTokenizer) -> Encoded:
    """`req`'s inputs as ids, with its route's `tokenizer`."""
    if req.token_ids is not None:
        return tokenizer.encode_ids(req.token_ids, req.options.truncate, req.options.truncation_direction)
    tokenizer.check_texts(req.texts)
    return await gateway.tokenize_queue(tokenizer).encode(req.texts, req.options)


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    texts: list[str] | None        # text input, or
    token_ids: list[list[int]] | None  # token-id input
    encoding_format: str = "float"
    options: RequestOptions = RequestOptions()

    @property
    def num_inputs(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids)

    def parameters(self, num_tokens: int) -> dict:
        """What the encoder needs (input_type and truncate are applied by the gateway's tokenizer). The
        class is decided here, on the whole request of `num_tokens`: the encoder sees only chunks of it."""
        priority = self.options.priority or default_priority(self.num_inputs, num_tokens)
        return {PRIORITY_PARAMETER: priority, **({"dimensions": self.options.dimensions} if self.options.dimensions else {})}


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_input(value) -> tuple[list[str] | None, list[list[int]] | None]:
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list):
        raise bad_request(f"'input' must be a string, a list of strings or token ids, got {type(value).__name__}",
                          "input")
    if not value:
        raise bad_request("'input' is an empty list: send at least one input", "input")
    if all(isinstance(v, str) for v in value):
        return value, None
    if all(_is_token_id(v) for v in value):
        return None, [value]
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not all(_is_token_id(t) for t in ids):
                raise bad_request(f"input[{i}] must be a list of integer token ids", "input")
        return None, value
    kinds = sorted({type(v).__name__ for v in value})
    raise bad_request(f"'input' mixes item types {kinds}: use all strings, all token ids, or all lists of token ids",
                      "input")


def parse_embedding_request(body: dict) -> EmbeddingRequest:
    unknown = sorted(set(body) - EMBEDDING_FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(EMBEDDING_FIELDS)}", unknown[0])
    if "input" not in body:
        raise bad_request("'input' is required", "input")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "model")
    texts, token_ids = _parse_input(body["input"])
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    try:
        options = RequestOptions.from_parameters({name: body[name] for name in EMBEDDING_OPTIONS if name in body},
                                                 json_body=True)
        if body.get("priority") is not None:  # the models' parameter priority_class (Triton reserves priority)
            options = dataclasses.replace(options, priority=check_priority(body["priority"], "priority"))
    except InputError as exc:
        raise from_input_error(exc) from None
    if "user" in body and not isinstance(body["user"], (str, type(None))):
        raise bad_request("'user' must be a string", "user")
    return EmbeddingRequest(model, texts, token_ids, fmt, options)


def check_width(request: EmbeddingRequest, width: int | None) -> None:
    """`dimensions` against the row width of the model the request names (once it is known)."""
    if width is not None:
        try:
            request.options.check_width(width)
        except InputError as exc:
            raise from_input_error(exc) from None


def render_embeddings(rows: np.ndarray, model: str, encoding_format: str, num_tokens: int) -> bytes:
    """rows: float32 [N, D]; base64 is little-endian float32 (what OpenAI's client decodes)."""
    if encoding_format == "base64":
        little = rows.astype("<f4", copy=False)
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                for i, row in enumerate(little)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    body = {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    parameters: dict  # the options the client set, as RerankOptions read them


def admission_tokens(request: RerankRequest, max_pair_tokens: int) -> int:
    """An upper bound on the tokens the reranker runs for `request` (the gateway does not
    tokenize pairs): a token covers at least one UTF-8 byte, so a pair is at most its
    bytes plus the template's, and at most `max_pair_tokens` (longer ones are cut)."""
    fixed = len(request.query.encode()) + len(str(request.parameters.get("instruction") or "").encode())
    fixed += PAIR_TEMPLATE_TOKENS
    return sum(min(max_pair_tokens, fixed + len(document.encode())) for document in request.documents)


def _document_text(i: int, doc) -> str:
    text = doc.get("text") if isinstance(doc, dict) else doc
    if not isinstance(text, str):
        raise bad_request(f"documents[{i}] must be a string or an object with a string 'text'", "documents")
    return text


def requested_model(body: dict) -> str | None:
    """The request's `model` (None: not given), before the rest is read against its limits."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    return model


def parse_rerank_request(body: dict, limits: TextLimits) -> RerankRequest:
    """`limits`: the rerank_tokenizer model's (PairTokenizerConfig), over the whole request."""
    unknown = sorted(set(body) - RERANK_FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(RERANK_FIELDS)}", unknown[0])
    model = requested_model(body)
    query = body.get("query")
    if not isinstance(query, str):
        raise bad_request("'query' is required and must be a string", "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise bad_request("'documents' is required and must be a non-empty list", "documents")
    try:
        check_texts([query], limits, "query")
        texts = check_texts([_document_text(i, d) for i, d in enumerate(documents)], limits, "documents")
        options = RerankOptions.from_parameters({name: body[name] for name in RERANK_OPTIONS if name in body})
        priority = "" if body.get("priority") is None else check_priority(body["priority"], "priority")
        top_n = body.get("top_n")
        if top_n is not None:  # above the number of documents: all of them
            top_n = check_integer("top_n", top_n, minimum=1, digits=False)
    except InputError as exc:
        raise from_input_error(exc) from None
    return_documents = body.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise bad_request(f"'return_documents' must be true or false, got {return_documents!r}", "return_documents")
    parameters = {name: getattr(options, name) for name in RERANK_OPTIONS if body.get(name) is not None}
    if priority or len(texts) > INTERACTIVE_MAX_TEXTS:
        # The class of the whole request (the reranker sees chunks); a smaller one is left to the reranker's rule.
        parameters[PRIORITY_PARAMETER] = priority or BATCH
    return RerankRequest(model, query, texts, top_n, return_documents, parameters)


def render_rerank(request: RerankRequest, scores: np.ndarray, model: str) -> dict:
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:request.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": float(scores[i])}
        if request.return_documents:
            result["document"] = {"text": request.documents[i]}
        results.append(result)
    return {"object": "list", "model": model, "results": results}

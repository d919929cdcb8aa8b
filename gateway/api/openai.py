"""The OpenAI-style routes. POST /v1/embeddings: OpenAI's request fields (plus input_type,
truncate, truncation_direction, chunking and priority) checked one by one, and the response in
float or base64. POST /v1/rerank in the Cohere/Jina shape: query, documents, top_n,
return_documents; results sorted by relevance_score with their index. The options and the text
limits follow the models' own rules (engine_lib/options.py, engine_lib/tokenization/text_input.py).
Compact types are /v2/embed's (gateway/api/cohere.py)."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from engine_lib.contract import RaggedTokens
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
from engine_lib.retrieval import COLBERT, MULTIVECTOR
from engine_lib.tokenization.text_input import TextLimits, check_texts
from rose_wire import ROSE_ENCODER

from ..batch import uploads
from ..batch.store import BatchStore
from ..engine.retrieval_calls import embed_retrieval, kind_of, late_interaction_scores, offered_types
from ..engine.tokenizing import GatewayTokenizer
from ..errors import ApiError, bad_request, from_input_error, too_large
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
    """/v1/rerank on a multi-vector embedder. BGE-M3: the query and documents embedded in one call,
    scored here with MaxSim, or with `weights` [dense, sparse, multivector] as FlagEmbedding's compute_score.
    ColBERT: the query embedded as a query, the documents as documents, MaxSim summed as PyLate's."""
    body = dict(body)
    weights = body.pop("weights", None)
    if kind_of(route.tokenizer.model_dir) == COLBERT:
        if weights is not None:
            raise bad_request("'weights' combines BGE-M3's dense, sparse and multi-vector scores; a colbert model "
                              "has multi-vectors only", "weights")
        return await _rerank_colbert(gateway, request, body, route)
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


async def _rerank_colbert(gateway: Gateway, request: Request, body: dict, route) -> Response:
    req = parse_rerank_request(body, route.tokenizer.config)
    gateway.require_ready(route.encoder)
    parts = [route.tokenizer.encode_texts(texts, RequestOptions(input_type=role))
             for texts, role in (([req.query], "query"), (req.documents, "document"))]

    async def both():  # a coroutine: dispatch closes it unstarted when it refuses the request
        return await asyncio.gather(*(embed_retrieval(gateway.backend, tokens, [MULTIVECTOR], {"input_type": role},
                                                      route.encoder) for tokens, role in zip(parts, ("query", "document"))))

    num_tokens = sum(int(t.seq_lens.sum()) for t in parts)
    query, documents = await gateway.dispatch(request, both(), num_tokens, "documents")
    gateway.metrics.inputs.labels("rerank").inc(len(req.documents))
    scores = late_interaction_scores({MULTIVECTOR: query[MULTIVECTOR] + documents[MULTIVECTOR]}, None, reduce="sum")
    return json_response(render_rerank(req, scores, route.name))


async def _encode(gateway: Gateway, req: EmbeddingRequest, tokenizer: GatewayTokenizer) -> RaggedTokens:
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


# The Batch API: /v1/files and /v1/batches in OpenAI's shapes; the store and the runner are gateway/batch/.
BATCH_ENDPOINTS = ("/v1/embeddings", "/v2/embed", "/v1/rerank")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
BATCH_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}
OUTPUT_EXPIRY_S = (3600, 30 * 24 * 3600)  # output_expires_after.seconds, as OpenAI: 1 hour to 30 days
PRIVATE_BATCH_FIELDS = ("output_expires_after_s", "finishing")


def batch_store(request: Request) -> BatchStore:
    store = request.app.state.batches
    if store is None:
        raise ApiError(404, "the Batch API is off on this gateway: start it with --data-dir (ROSE_GATEWAY_DATA_DIR)",
                       None, "batch_api_off")
    return store


def owner_of(gateway: Gateway, request: Request) -> str:
    """Whose files and batches: a hash of the request's API key (authorized already); "" without keys."""
    if not gateway.config.api_keys:
        return ""
    key = request.headers.get("authorization", "").encode("latin-1").partition(b" ")[2].strip()
    return hashlib.sha256(key).hexdigest()


def _expires_after(fields: dict, prefix: str, param: str) -> int | None:
    """`{prefix}[anchor]` = created_at and `{prefix}[seconds]` (a form's nested object) -> seconds."""
    anchor, seconds = fields.get(f"{prefix}[anchor]"), fields.get(f"{prefix}[seconds]")
    if anchor is None and seconds is None:
        return None
    return _check_expiry({"anchor": anchor, "seconds": int(seconds) if str(seconds).isdigit() else seconds}, param)


def _check_expiry(value, param: str) -> int:
    if not isinstance(value, dict) or value.get("anchor") != "created_at":
        raise bad_request(f"'{param}' must be {{\"anchor\": \"created_at\", \"seconds\": N}}", param)
    try:
        return check_integer(f"{param}.seconds", value.get("seconds"), *OUTPUT_EXPIRY_S, digits=False)
    except InputError as exc:
        raise from_input_error(exc, param) from None


async def create_file(gateway: Gateway, request: Request) -> Response:
    store = batch_store(request)
    limit = store.limits.max_file_bytes
    received, kept = store.upload_path(), store.upload_path()
    try:
        await uploads.receive(request, received, limit + uploads.FORM_OVERHEAD)
        form = await asyncio.to_thread(uploads.split_form, received, request.headers.get("content-type", ""), kept)
        if form.fields.get("purpose") != "batch":
            raise bad_request(f"'purpose' must be 'batch' (the files this gateway keeps), got "
                              f"{form.fields.get('purpose')!r}", "purpose")
        if form.filename is None:
            raise bad_request("'file' is required: the JSONL file of requests", "file")
        if form.file_bytes > limit:
            raise too_large(f"the file is {form.file_bytes} bytes; a batch file is at most {limit}", "file")
        lines = await asyncio.to_thread(uploads.count_lines, kept)
        if not lines:
            raise bad_request("the file holds no requests (no line that is not blank)", "file")
        if lines > store.limits.max_file_lines:
            raise bad_request(f"the file holds {lines} requests; a batch file at most {store.limits.max_file_lines}",
                              "file")
        expires_after = _expires_after(form.fields, "expires_after", "expires_after")
        created = store.add_file(owner_of(gateway, request), kept, form.filename, "batch", form.file_bytes)
        if expires_after:
            created = store.set_file_expiry(created["id"], created["created_at"] + expires_after)
        return json_response(created)
    finally:
        received.unlink(missing_ok=True)
        kept.unlink(missing_ok=True)


def _page(data: list[dict], has_more: bool) -> dict:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def _limit(request: Request, default: int, maximum: int) -> int:
    value = request.query_params.get("limit")
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= maximum:
        raise bad_request(f"'limit' must be an integer from 1 to {maximum}, got {value!r}", "limit")
    return int(value)


async def list_files(gateway: Gateway, request: Request) -> Response:
    store = batch_store(request)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"'order' must be 'asc' or 'desc', got {order!r}", "order")
    data, has_more = store.list_files(owner_of(gateway, request), request.query_params.get("purpose"),
                                      _limit(request, 10000, 10000), order, request.query_params.get("after"))
    return json_response(_page(data, has_more))


async def retrieve_file(gateway: Gateway, request: Request) -> Response:
    return json_response(batch_store(request).file(owner_of(gateway, request), request.path_params["file_id"]))


async def delete_file(gateway: Gateway, request: Request) -> Response:
    return json_response(batch_store(request).delete_file(owner_of(gateway, request), request.path_params["file_id"]))


async def file_content(gateway: Gateway, request: Request) -> Response:
    store, file_id = batch_store(request), request.path_params["file_id"]
    store.file(owner_of(gateway, request), file_id)
    return FileResponse(store.file_path(file_id), media_type="application/octet-stream")


def public_batch(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in PRIVATE_BATCH_FIELDS}


def _metadata(value) -> dict | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()):
        raise bad_request("'metadata' must be an object of at most 16 strings (keys up to 64 characters, values "
                          "up to 512)", "metadata")
    return value


async def create_batch(gateway: Gateway, request: Request) -> Response:
    store, body = batch_store(request), gateway.read_json(request)
    unknown = sorted(set(body) - BATCH_FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(BATCH_FIELDS)}", unknown[0])
    endpoint = body.get("endpoint")
    if endpoint not in BATCH_ENDPOINTS:
        raise bad_request(f"'endpoint' must be one of {list(BATCH_ENDPOINTS)}, got {endpoint!r}", "endpoint")
    window = body.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise bad_request(f"'completion_window' must be one of {list(COMPLETION_WINDOWS)}, got {window!r}",
                          "completion_window")
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise bad_request("'input_file_id' is required: the id of a file uploaded with purpose 'batch'",
                          "input_file_id")
    expires_after = body.get("output_expires_after")
    created = store.create_batch(owner_of(gateway, request), endpoint, input_file_id, COMPLETION_WINDOWS[window],
                                 window, _metadata(body.get("metadata")),
                                 None if expires_after is None else _check_expiry(expires_after,
                                                                                  "output_expires_after"))
    return json_response(public_batch(created))


async def list_batches(gateway: Gateway, request: Request) -> Response:
    data, has_more = batch_store(request).list_batches(owner_of(gateway, request), _limit(request, 20, 100),
                                                       request.query_params.get("after"))
    return json_response(_page([public_batch(b) for b in data], has_more))


async def retrieve_batch(gateway: Gateway, request: Request) -> Response:
    return json_response(public_batch(batch_store(request).batch(owner_of(gateway, request),
                                                                 request.path_params["batch_id"])))


async def cancel_batch(gateway: Gateway, request: Request) -> Response:
    return json_response(public_batch(batch_store(request).cancel(owner_of(gateway, request),
                                                                  request.path_params["batch_id"])))

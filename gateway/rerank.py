"""POST /v1/rerank in the Cohere/Jina shape: query, documents, top_n,
return_documents; results sorted by relevance_score with their index. The
options (raw_scores, truncate, instruction, priority) and the text limits are the
reranker models' own (engine_lib/options.py, engine_lib/tokenization/text_input.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine_lib.errors import InputError
from engine_lib.options import (
    BATCH,
    INTERACTIVE_MAX_TEXTS,
    PRIORITY_PARAMETER,
    RerankOptions,
    check_integer,
    check_priority,
)
from engine_lib.tokenization.text_input import TextLimits, check_texts

from .errors import bad_request, from_input_error

OPTIONS = ("raw_scores", "truncate", "instruction")  # RerankOptions fields, passed on to the reranker
FIELDS = {"model", "query", "documents", "top_n", "return_documents", "priority", *OPTIONS}
PAIR_TEMPLATE_TOKENS = 256  # a pair template's own tokens at most (Qwen3's judge prompt and task: ~100)


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    parameters: dict  # the options the client set, as RerankOptions read them


def admission_tokens(request: "RerankRequest", max_pair_tokens: int) -> int:
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


def parse_request(body: dict, limits: TextLimits) -> RerankRequest:
    """`limits`: the rerank_tokenizer model's (PairTokenizerConfig), over the whole request."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(FIELDS)}", unknown[0])
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
        options = RerankOptions.from_parameters({name: body[name] for name in OPTIONS if name in body})
        priority = "" if body.get("priority") is None else check_priority(body["priority"], "priority")
        top_n = body.get("top_n")
        if top_n is not None:  # above the number of documents: all of them
            top_n = check_integer("top_n", top_n, minimum=1, digits=False)
    except InputError as exc:
        raise from_input_error(exc) from None
    return_documents = body.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise bad_request(f"'return_documents' must be true or false, got {return_documents!r}", "return_documents")
    parameters = {name: getattr(options, name) for name in OPTIONS if body.get(name) is not None}
    if priority or len(texts) > INTERACTIVE_MAX_TEXTS:
        # The class of the whole request (the reranker sees chunks); a smaller one is left to the reranker's rule.
        parameters[PRIORITY_PARAMETER] = priority or BATCH
    return RerankRequest(model, query, texts, top_n, return_documents, parameters)


def render_results(request: RerankRequest, scores: np.ndarray, model: str) -> dict:
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:request.top_n]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": float(scores[i])}
        if request.return_documents:
            result["document"] = {"text": request.documents[i]}
        results.append(result)
    return {"object": "list", "model": model, "results": results}

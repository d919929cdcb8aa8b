"""POST /v1/rerank in the Cohere/Jina shape: query, documents, top_n,
return_documents; results sorted by relevance_score with their index."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import bad_request, too_large

FIELDS = {"model", "query", "documents", "top_n", "return_documents", "raw_scores", "truncate", "instruction"}


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    parameters: dict


def _document_text(i: int, doc) -> str:
    text = doc.get("text") if isinstance(doc, dict) else doc
    if not isinstance(text, str):
        raise bad_request(f"documents[{i}] must be a string or an object with a string 'text'", "documents")
    if not text.strip():
        raise bad_request(f"documents[{i}] is empty or only whitespace", "documents")
    return text


def parse_request(body: dict, max_documents: int) -> RerankRequest:
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown}; known: {sorted(FIELDS)}", unknown[0])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad_request("'query' is required and must be a non-empty string", "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise bad_request("'documents' is required and must be a non-empty list", "documents")
    if len(documents) > max_documents:
        raise too_large(f"'documents' has {len(documents)} items; at most {max_documents}", "documents")
    texts = [_document_text(i, d) for i, d in enumerate(documents)]
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request(f"'top_n' must be a positive integer, got {top_n!r}", "top_n")
    return_documents = body.get("return_documents", True)
    parameters = {}
    for name in ("return_documents", "raw_scores", "truncate"):
        if name in body and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be true or false, got {body[name]!r}", name)
    for name in ("raw_scores", "truncate"):
        if name in body:
            parameters[name] = body[name]
    if "instruction" in body:
        if not isinstance(body["instruction"], str):
            raise bad_request("'instruction' must be a string", "instruction")
        parameters["instruction"] = body["instruction"]
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

"""A random-weight Qwen3 embedder served by name (the session's multi-model launch) end to end
through its Triton ensemble and unary front == transformers."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.runner.self_check import MIN_COSINE
from rose_wire import EMBEDDER, served_models
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http
from testing.tiny_models import cosine_rows

TEXTS = ["hello world", "the lazy dog jumps over the quick brown fox", "vectors", "where is the search engine"]
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


@pytest.fixture(scope="module")
def qwen3_service(multi_server):
    """The session's multi-model server and transformers on the same weights (EOS appended, last
    token, L2-normalised)."""
    return multi_server, multi_server.embedder.reference


def names(server):
    return served_models(server.embedder_name, EMBEDDER)


def test_documents_match_transformers(qwen3_service):
    server, reference = qwen3_service
    got = embed_stream(server.grpc_url, TEXTS, model=names(server).ensemble)
    assert got.shape == (len(TEXTS), 64)
    assert cosine_rows(got, reference(TEXTS)).min() >= MIN_COSINE


def test_queries_use_the_instruction_template(qwen3_service):
    server, reference = qwen3_service
    got = embed_generate(server.http_url, TEXTS, parameters={"input_type": "query"}, model=names(server).ensemble)
    assert cosine_rows(got, reference(TEXTS, INSTRUCTION)).min() >= MIN_COSINE
    assert cosine_rows(got, reference(TEXTS)).max() < 0.99  # the template changes the embedding


def test_matryoshka_dimensions(qwen3_service):
    server, reference = qwen3_service
    got = embed_stream(server.grpc_url, TEXTS, parameters={"dimensions": 16}, model=names(server).ensemble)
    full = reference(TEXTS)[:, :16]
    assert got.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosine_rows(got, full).min() >= MIN_COSINE


def test_unary_front_equals_the_stream_with_the_query_template_and_options(qwen3_service):
    """The unary `embed` front tokenizes itself with the tokenizer model's code and folder:
    the instruction template, EOS and options give the ensemble's numbers."""
    server, reference = qwen3_service
    params = {"input_type": "query", "dimensions": 16, "normalize": False}
    model = names(server)
    streamed = embed_stream(server.grpc_url, TEXTS, parameters=params, model=model.ensemble)
    assert cosine_rows(streamed, reference(TEXTS, INSTRUCTION)[:, :16]).min() >= MIN_COSINE
    assert not np.allclose(np.linalg.norm(streamed, axis=1), 1.0)
    for unary in (embed_unary_grpc(server.grpc_url, TEXTS, params, model.front),
                  embed_unary_http(server.http_url, TEXTS, params, model.front)):
        np.testing.assert_allclose(unary, streamed, atol=1e-6)
    documents = embed_unary_grpc(server.grpc_url, TEXTS, {"normalize": False}, model.front)
    assert cosine_rows(documents[:, :16], streamed).max() < 0.99  # the template changed the ids

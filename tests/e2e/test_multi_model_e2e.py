"""Several models by name from one launch (the session's `multi_server`): the default
all-MiniLM-L6-v2 (BERT) under today's names, a random-weight Qwen3 embedder from a models
file and a random-weight Qwen3 reranker from --rerank-model. Each embedder against its
reference on every path (ensemble gRPC streaming, HTTP generate, the unary front over gRPC
and HTTP, the gateway by `model`, rose_client); unknown names are 404 naming the served
ones; each model has its own encoder with its own budget. The reranker's paths:
test_rerank_e2e.py (its `qwen3` case)."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from engine_lib.runner.self_check import MIN_COSINE
from rose_client import EmbeddingClient
from rose_wire import DEFAULT_EMBEDDER, EMBEDDER, served_models
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http, post_gateway
from testing.metrics import sample, scrape
from testing.tiny_models import cosine_rows
from testing.waiting import wait_until

TEXTS = ["hello world", "the lazy dog jumps over the quick brown fox", "vectors", "where is the search engine"]
DEFAULT_NAME = "all-MiniLM-L6-v2"




@pytest.fixture(scope="module")
def embedders(multi_server, reference_model):
    """{gateway name: (its Triton models, its reference: texts -> L2-normalised rows, width)}."""
    return {DEFAULT_NAME: (DEFAULT_EMBEDDER, lambda texts: reference_model.encode(texts, normalize_embeddings=True),
                           384),
            multi_server.embedder_name: (served_models(multi_server.embedder_name, EMBEDDER),
                                         multi_server.embedder.reference, 64)}


@pytest.mark.parametrize("which", ["default", "named"])
def test_each_embedder_matches_its_reference_on_every_path(multi_server, embedders, which):
    server = multi_server
    name = DEFAULT_NAME if which == "default" else server.embedder_name
    models, reference, width = embedders[name]
    status, body = post_gateway(server, "/v1/embeddings", {"model": name, "input": TEXTS})
    assert status == 200 and body["model"] == name, body
    status, cohere = post_gateway(server, "/v2/embed", {"model": name, "texts": TEXTS, "embedding_types": ["float"]})
    assert status == 200, cohere
    paths = {
        "gateway /v2/embed": np.array(cohere["embeddings"]["float"], dtype=np.float32),
        "ensemble gRPC": embed_stream(server.grpc_url, TEXTS, model=models.ensemble),
        "ensemble HTTP generate": embed_generate(server.http_url, TEXTS, model=models.ensemble),
        "unary gRPC": embed_unary_grpc(server.grpc_url, TEXTS, model=models.front),
        "unary HTTP": embed_unary_http(server.http_url, TEXTS, model=models.front),
        "gateway": np.array([d["embedding"] for d in body["data"]], dtype=np.float32),
        "rose_client": EmbeddingClient([server.grpc_url], model=models.ensemble).embed(TEXTS),
    }
    with urllib.request.urlopen(f"{server.gateway_url}/v1/models/{name}", timeout=120) as response:
        ranges = json.load(response)["int8_ranges"]  # this model's calibration, from its own encoder
    assert np.array(ranges).shape == (2, width)
    expected = reference(TEXTS)
    for path, rows in paths.items():
        assert rows.shape == (len(TEXTS), width), path
        assert cosine_rows(rows, expected).min() >= MIN_COSINE, path
        np.testing.assert_allclose(rows, paths["ensemble gRPC"], atol=1e-5, err_msg=path)


def test_models_lists_every_served_model(multi_server):
    with urllib.request.urlopen(f"{multi_server.gateway_url}/v1/models", timeout=10) as response:
        names = [m["id"] for m in json.load(response)["data"]]
    assert names == [DEFAULT_NAME, multi_server.embedder_name, multi_server.retrieval_name, multi_server.colbert_name,
                     multi_server.reranker_name]


def test_unknown_names_are_404_naming_the_served_ones(multi_server):
    server = multi_server
    status, body = post_gateway(server, "/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"})
    assert status == 404 and body["error"]["param"] == "model", body
    served = [DEFAULT_NAME, server.embedder_name, server.retrieval_name, server.colbert_name]
    assert f"served: {served}" in body["error"]["message"]
    status, body = post_gateway(server, "/v1/embeddings", {"model": server.reranker_name, "input": "x"})
    assert status == 404 and "it is a reranker" in body["error"]["message"], body
    status, body = post_gateway(server, "/v1/rerank", {"model": "rerank", "query": "q", "documents": ["d"]})
    assert status == 404 and f"served: {[server.reranker_name]}" in body["error"]["message"], body
    status, body = post_gateway(server, "/v1/rerank", {"model": server.embedder_name, "query": "q", "documents": ["d"]})
    assert status == 404 and "it is an embedder" in body["error"]["message"], body


def test_each_model_has_its_own_encoder_and_budget(multi_server, embedders):
    """Three encoders, three schedulers: the models file's max_batch_tokens reached the named
    embedder's alone, and each encoder answered its own model's requests."""
    server = multi_server
    for name, (models, _, _) in embedders.items():
        embed_stream(server.grpc_url, TEXTS, model=models.ensemble)
    assert post_gateway(server, "/v1/rerank", {"query": "q", "documents": ["d"]})[0] == 200
    encoders = {"rose_encoder": 8192, f"{server.embedder_name}_encoder": 4096,
                f"{server.reranker_name}_encoder": 8192}

    def each_encoder_answered():  # an encoder publishes its counters every 0.5 s: they may show a little later
        samples = scrape(server)[1]
        return samples if all(sample(samples, "rose_requests_total", model=encoder, outcome="ok") >= 1
                              for encoder in encoders) else None

    samples = wait_until(each_encoder_answered, 60, "every encoder to count a request answered ok", 0.05)
    for encoder, budget in encoders.items():
        assert sample(samples, "rose_batch_token_budget", model=encoder) == budget, encoder

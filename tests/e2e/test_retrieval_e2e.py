"""A BGE-M3-kind model served by name (multi_server's random-weight `bge-m3-tiny`): dense, sparse and
multi-vector outputs from one request on every Triton path (ensemble gRPC streaming, HTTP generate,
the unary front), against FlagEmbedding on the same folder; a dense-only model refuses them."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from engine_lib.service.retrieval_outputs import split_multivector, split_sparse
from rose_wire import (DEFAULT_EMBEDDER, EMBEDDER, EMBEDDINGS, MULTIVECTOR, MULTIVECTOR_COUNTS, SPARSE_COUNTS,
                       SPARSE_INDICES, SPARSE_VALUES, TEXT, served_models)
from testing.embed_clients import post_gateway as post
from testing.tiny_models import cosine_rows
from testing.tiny_retrieval import flag_m3

TEXTS = ["what is the capital of france", "paris is the capital , paris", "gravity"]
ALL = {"embedding_types": "float,sparse,multivector"}
SHAPES = {EMBEDDINGS: (np.float32, 2), SPARSE_INDICES: (np.int64, 1), SPARSE_VALUES: (np.float32, 1),
          SPARSE_COUNTS: (np.int64, 1), MULTIVECTOR: (np.float32, 2), MULTIVECTOR_COUNTS: (np.int64, 1)}


def _texts():
    return np.array([t.encode() for t in TEXTS], dtype=object)


def stream(url, model):
    from testing.embed_clients import stream_outputs

    return stream_outputs(url, {TEXT: _texts()}, parameters=ALL, model=model)


def generate(url, model):
    body = json.dumps({TEXT: TEXTS, "parameters": ALL}).encode()
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.load(response)
    out = {n: np.asarray(reply[n], dtype=d) for n, (d, _) in SHAPES.items() if n in reply}
    width = len(out[EMBEDDINGS]) // len(TEXTS)
    out[EMBEDDINGS] = out[EMBEDDINGS].reshape(len(TEXTS), width)
    out[MULTIVECTOR] = out[MULTIVECTOR].reshape(-1, width)
    return out


def unary(protocol, url, model):
    client = protocol.InferenceServerClient(url)
    try:
        text = protocol.InferInput(TEXT, [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(_texts())
        result = client.infer(model, [text], outputs=[protocol.InferRequestedOutput(n) for n in SHAPES],
                              parameters=ALL)
        return {n: result.as_numpy(n) for n in SHAPES}
    finally:
        client.close()


def test_three_outputs_from_one_request_match_flagembedding_on_every_path(multi_server):
    server = multi_server
    models = served_models(server.retrieval_name, EMBEDDER)
    want = flag_m3(server.retrieval_folder).encode(TEXTS, return_dense=True, return_sparse=True,
                                                   return_colbert_vecs=True, max_length=128)
    paths = {"ensemble gRPC": stream(server.grpc_url, models.ensemble),
             "ensemble HTTP generate": generate(server.http_url, models.ensemble),
             "unary gRPC": unary(grpcclient, server.grpc_url, models.front),
             "unary HTTP": unary(httpclient, server.http_url, models.front)}
    for path, got in paths.items():
        assert {n: (a.dtype, a.ndim) for n, a in got.items() if n in SHAPES} == \
            {n: (np.dtype(d), k) for n, (d, k) in SHAPES.items()}, path
        assert cosine_rows(got[EMBEDDINGS], want["dense_vecs"]).min() >= 0.999, path
        for (indices, values), reference in zip(split_sparse(got), want["lexical_weights"], strict=True):
            ids = sorted(int(k) for k in reference)
            assert indices.tolist() == ids, path
            np.testing.assert_allclose(values, [reference[str(i)] for i in ids], rtol=1e-4, err_msg=path)
        for vectors, reference in zip(split_multivector(got), want["colbert_vecs"], strict=True):
            assert vectors.shape == reference.shape and cosine_rows(vectors, reference).min() >= 0.999, path


def test_compact_multivectors_over_the_unary_front(multi_server):
    from rose_wire import MULTIVECTOR_BINARY, MULTIVECTOR_FP16

    client = grpcclient.InferenceServerClient(multi_server.grpc_url)
    try:
        text = grpcclient.InferInput(TEXT, [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(_texts())
        names = [MULTIVECTOR, MULTIVECTOR_FP16, MULTIVECTOR_BINARY, MULTIVECTOR_COUNTS]
        result = client.infer(served_models(multi_server.retrieval_name, EMBEDDER).front, [text],
                              outputs=[grpcclient.InferRequestedOutput(n) for n in names])
    finally:
        client.close()
    vectors = result.as_numpy(MULTIVECTOR)
    assert result.as_numpy(MULTIVECTOR_FP16).dtype == np.float16
    np.testing.assert_allclose(result.as_numpy(MULTIVECTOR_FP16), vectors, atol=1e-3)
    np.testing.assert_array_equal(np.unpackbits(result.as_numpy(MULTIVECTOR_BINARY), axis=1)[:, :vectors.shape[1]],
                                  vectors > 0)


def test_a_dense_model_refuses_sparse_naming_the_type(multi_server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="'sparse' is not given by this model"):
        unary(grpcclient, multi_server.grpc_url, DEFAULT_EMBEDDER.front)




def test_gateway_v2_embed_gives_all_three_in_one_call_and_embed_sparse_as_tei(multi_server):
    server = multi_server
    want = flag_m3(server.retrieval_folder).encode(TEXTS, return_dense=True, return_sparse=True,
                                                   return_colbert_vecs=True, max_length=128)
    status, body = post(server, "/v2/embed", {"model": server.retrieval_name, "texts": TEXTS,
                                              "embedding_types": ["float", "sparse", "multivector"]})
    assert status == 200, body
    got = body["embeddings"]
    assert cosine_rows(np.array(got["float"]), want["dense_vecs"]).min() >= 0.999
    for sparse, vectors, weights, colbert in zip(got["sparse"], got["multivector"], want["lexical_weights"],
                                                 want["colbert_vecs"], strict=True):
        assert sparse["indices"] == sorted(int(k) for k in weights)
        np.testing.assert_allclose(sparse["values"], [weights[str(i)] for i in sparse["indices"]], rtol=1e-4)
        assert cosine_rows(np.array(vectors), colbert).min() >= 0.999
    status, top = post(server, "/v2/embed", {"model": server.retrieval_name, "texts": TEXTS,
                                             "embedding_types": ["sparse"], "sparse_top_k": 2})
    assert status == 200 and list(top["embeddings"]) == ["sparse"], top
    for sparse, weights in zip(top["embeddings"]["sparse"], want["lexical_weights"]):
        assert sorted(sparse["values"], reverse=True) == pytest.approx(sorted(weights.values(), reverse=True)[:2],
                                                                        rel=1e-4)
    for model in (server.retrieval_name, None):  # left out: the only served model that gives sparse
        status, tei = post(server, "/embed_sparse", {"inputs": TEXTS, **({"model": model} if model else {})})
        assert status == 200, tei
        assert [[e["index"] for e in text] for text in tei] == [s["indices"] for s in got["sparse"]]
        for text, sparse in zip(tei, got["sparse"]):
            np.testing.assert_allclose([e["value"] for e in text], sparse["values"], rtol=1e-6)


def test_gateway_refuses_types_a_model_cannot_give_and_multivectors_past_the_token_cap(multi_server):
    server = multi_server
    status, body = post(server, "/v2/embed", {"model": server.embedder_name, "texts": ["x"],
                                              "embedding_types": ["float", "sparse"]})
    assert status == 400 and body["error"]["param"] == "embedding_types", body
    assert f"model {server.embedder_name!r} cannot give embedding type 'sparse'" in body["error"]["message"]
    status, body = post(server, "/embed_sparse", {"inputs": "x", "model": server.embedder_name})
    assert status == 400 and "cannot give embedding type 'sparse'" in body["error"]["message"], body
    from gateway.api.cohere import MAX_MULTIVECTOR_TOKENS

    long = " ".join(["paris is the capital"] * 40)  # cut at the model's 128 tokens
    texts = [long] * (MAX_MULTIVECTOR_TOKENS // 128 + 1)
    status, body = post(server, "/v2/embed", {"model": server.retrieval_name, "texts": texts,
                                              "embedding_types": ["multivector"]})
    assert status == 413 and "multi-vector" in body["error"]["message"], body


def test_rerank_on_bge_m3_scores_maxsim_and_weighted_like_compute_score(multi_server):
    server = multi_server
    query, documents = TEXTS[0], TEXTS[1:]
    want = flag_m3(server.retrieval_folder).compute_score([(query, d) for d in documents], max_query_length=128,
                                                          max_passage_length=128, weights_for_different_modes=[0.4, 0.2, 0.4])
    for weights, key in ((None, "colbert"), ([0.4, 0.2, 0.4], "colbert+sparse+dense")):
        status, body = post(server, "/v1/rerank", {"model": server.retrieval_name, "query": query,
                                                   "documents": documents, **({"weights": weights} if weights else {})})
        assert status == 200 and body["model"] == server.retrieval_name, body
        scores = [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]
        np.testing.assert_allclose(scores, want[key], atol=1e-4, err_msg=key)
    status, body = post(server, "/v1/rerank", {"model": server.retrieval_name, "query": query,
                                               "documents": documents, "weights": [1, 1]})
    assert status == 400 and body["error"]["param"] == "weights", body


COLBERT_TEXTS = ["what is the capital of france ?", "paris is the capital , paris !", "gravity"]


def test_colbert_queries_and_documents_match_pylate_on_the_triton_paths(multi_server):
    """multi_server's `colbert-tiny` (PyLate's layout): input_type query / document on the ensemble stream
    and the unary front, against PyLate's encoding (testing/pylate_reference.py) on the same folder."""
    from testing.pylate_reference import PylateColbert

    server, reference = multi_server, PylateColbert(multi_server.colbert_folder)
    models = served_models(server.colbert_name, EMBEDDER)
    texts = np.array([t.encode() for t in COLBERT_TEXTS], dtype=object)
    for input_type in ("query", "document"):
        want = reference.encode(COLBERT_TEXTS, input_type == "query")
        parameters = {"input_type": input_type, "embedding_types": "multivector"}
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            text = httpclient.InferInput(TEXT, [len(texts)], "BYTES")
            text.set_data_from_numpy(texts)
            unary_result = client.infer(models.front, [text], parameters=parameters,
                                        outputs=[httpclient.InferRequestedOutput(n) for n in (MULTIVECTOR,
                                                                                              MULTIVECTOR_COUNTS)])
        finally:
            client.close()
        from testing.embed_clients import stream_outputs

        paths = {"ensemble gRPC": stream_outputs(server.grpc_url, {TEXT: texts}, parameters=parameters,
                                                 model=models.ensemble),
                 "unary HTTP": {n: unary_result.as_numpy(n) for n in (MULTIVECTOR, MULTIVECTOR_COUNTS)}}
        for path, got in paths.items():
            for vectors, reference_vectors in zip(split_multivector(got), want, strict=True):
                assert vectors.shape == reference_vectors.shape, (path, input_type)
                assert cosine_rows(vectors, reference_vectors).min() >= 0.999, (path, input_type)


def test_gateway_colbert_v2_embed_by_input_type_and_rerank_with_pylate_maxsim(multi_server):
    from testing.pylate_reference import PylateColbert, colbert_scores

    server, reference = multi_server, PylateColbert(multi_server.colbert_folder)
    for input_type, is_query in (("search_query", True), ("search_document", False)):
        status, body = post(server, "/v2/embed", {"model": server.colbert_name, "texts": COLBERT_TEXTS,
                                                  "input_type": input_type, "embedding_types": ["multivector"]})
        assert status == 200, body
        for vectors, want in zip(body["embeddings"]["multivector"], reference.encode(COLBERT_TEXTS, is_query),
                                 strict=True):
            assert np.shape(vectors) == want.shape and cosine_rows(np.array(vectors), want).min() >= 0.999
    query, documents = COLBERT_TEXTS[0], COLBERT_TEXTS[1:]
    want = colbert_scores(reference.encode([query], True)[0], reference.encode(documents, False))
    status, body = post(server, "/v1/rerank", {"model": server.colbert_name, "query": query, "documents": documents})
    assert status == 200 and body["model"] == server.colbert_name, body
    scores = [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]
    np.testing.assert_allclose(scores, want, atol=1e-4)
    status, body = post(server, "/v1/rerank", {"model": server.colbert_name, "query": query, "documents": documents,
                                               "weights": [0.4, 0.2, 0.4]})
    assert status == 400 and body["error"]["param"] == "weights", body
    status, body = post(server, "/v2/embed", {"model": server.colbert_name, "texts": ["x"],
                                              "embedding_types": ["float"]})
    assert status == 400 and f"model {server.colbert_name!r} cannot give embedding type 'float'" in \
        body["error"]["message"], body
    status, body = post(server, "/v1/embeddings", {"model": server.colbert_name, "input": "x"})
    assert status == 400 and "'float' is not given by this model (a colbert model" in body["error"]["message"], body

"""Retrieval kinds (engine_lib/retrieval.py) through the real runner, service and endpoint against the
reference libraries on the same random-weight folders: FlagEmbedding's BGE-M3 embedder
(encode with dense, sparse and ColBERT vectors; compute_score) and sentence-transformers' SparseEncoder."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.service.batching import BatchingService
from engine_lib.service.endpoint import Endpoint
from engine_lib.service.retrieval_outputs import split_multivector, split_sparse
from engine_lib.tokenization.colbert import text_tokenizer
from engine_lib.config import TokenizerConfig
from rose_wire import EMBEDDINGS
from testing.tiny_models import cosine_rows
from testing.tiny_retrieval import flag_m3, save_bge_m3, save_splade

TEXTS = ["what is the capital of france", "paris is the capital and largest city of france , paris paris",
         "hybrid retrieval mixes dense sparse and late interaction vectors", "gravity"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval")
    return {"bge-m3": save_bge_m3(root / "m3"), "splade": save_splade(root / "splade")}


_RUNNERS = {}


def serve(folder, options: RequestOptions, texts=TEXTS, runner: ModelRunner | None = None):
    """Every text through the folder's tokenizer (text_tokenizer) -> Endpoint(BatchingService(ModelRunner)): the
    answer tensors; the runner given, else the folder's on the CPU in fp32. A small token budget splits the texts
    over several batches."""
    if runner is None:
        if folder not in _RUNNERS:
            _RUNNERS[folder] = ModelRunner(str(folder), device="cpu", dtype="float32", cpu_linear="plain")
        runner = _RUNNERS[folder]
    endpoint = Endpoint(BatchingService(runner, max_batch_tokens=24, max_batch_sequences=8))
    options = endpoint.output.select(options, [], [])
    tokens = text_tokenizer(str(folder), TokenizerConfig()).encode(texts, options)
    done, answer = threading.Event(), {}

    def on_done(result, error):
        answer.update(result=result, error=error)
        done.set()

    try:
        endpoint.submit(tokens, on_done)
        assert done.wait(60)
    finally:
        endpoint.close()
    assert answer["error"] is None, answer["error"]
    return answer["result"]


def assert_sparse_equal(got: list, want: list[dict]) -> None:
    for (indices, values), reference in zip(got, want, strict=True):
        ref_ids = np.array(sorted(int(k) for k in reference), dtype=np.int64)
        assert list(indices) == sorted(indices)
        np.testing.assert_array_equal(indices, ref_ids)
        ref_values = np.array([reference[str(i)] for i in ref_ids], dtype=np.float64)
        np.testing.assert_allclose(values, ref_values, rtol=1e-4, atol=1e-7)


def test_bge_m3_dense_sparse_and_multivector_match_flagembedding_from_one_request(folders):
    got = serve(folders["bge-m3"], RequestOptions(embedding_types=("float", "sparse", "multivector")))
    want = flag_m3(folders["bge-m3"]).encode(TEXTS, return_dense=True, return_sparse=True,
                                              return_colbert_vecs=True, max_length=128)
    assert cosine_rows(got[EMBEDDINGS], want["dense_vecs"]).min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(got[EMBEDDINGS], axis=1), 1.0, rtol=1e-5)
    assert_sparse_equal(split_sparse(got), want["lexical_weights"])
    for vectors, reference in zip(split_multivector(got), want["colbert_vecs"], strict=True):
        assert vectors.shape == reference.shape
        assert cosine_rows(vectors, reference).min() >= 0.999


def test_bge_m3_scores_from_served_outputs_match_compute_score(folders):
    """FlagEmbedding's compute_score (dense, lexical, ColBERT) from the served query and document outputs."""
    query, documents = TEXTS[0], TEXTS[1:]
    types = RequestOptions(embedding_types=("float", "sparse", "multivector"))
    q, d = serve(folders["bge-m3"], types, [query]), serve(folders["bge-m3"], types, documents)
    want = flag_m3(folders["bge-m3"]).compute_score([(query, doc) for doc in documents], max_query_length=128,
                                                    max_passage_length=128)
    q_sparse, q_vectors = split_sparse(q)[0], split_multivector(q)[0]
    for i, (d_sparse, d_vectors) in enumerate(zip(split_sparse(d), split_multivector(d))):
        dense = float(q[EMBEDDINGS][0] @ d[EMBEDDINGS][i])
        shared, qi, di = np.intersect1d(q_sparse[0], d_sparse[0], return_indices=True)
        lexical = float((q_sparse[1][qi].astype(np.float64) * d_sparse[1][di]).sum())
        maxsim = float((q_vectors @ d_vectors.T).max(1).mean())
        assert dense == pytest.approx(want["dense"][i], abs=1e-4)
        assert lexical == pytest.approx(want["sparse"][i], rel=1e-4, abs=1e-4)
        assert maxsim == pytest.approx(want["colbert"][i], abs=1e-4)


def test_splade_matches_sentence_transformers_sparse_encoder_and_top_k_keeps_the_largest(folders, monkeypatch):
    """The MLM logits chunked over 3 tokens at a time (bounded memory) give the reference's weights."""
    from sentence_transformers import SparseEncoder

    from engine_lib.models import retrieval_heads

    monkeypatch.setattr(retrieval_heads, "SPLADE_CHUNK_ELEMENTS", 3 * 128)

    reference = SparseEncoder(str(folders["splade"]), device="cpu").encode(TEXTS, convert_to_tensor=True)
    reference = reference.to_dense().numpy()
    got = split_sparse(serve(folders["splade"], RequestOptions()))
    want = [{str(i): float(row[i]) for i in np.flatnonzero(row)} for row in reference]
    assert_sparse_equal(got, want)
    top = split_sparse(serve(folders["splade"], RequestOptions(sparse_top_k=5)))
    for (indices, values), row in zip(top, reference):
        assert len(indices) == 5 and list(indices) == sorted(indices)
        np.testing.assert_allclose(np.sort(values)[::-1], np.sort(row)[::-1][:5], rtol=1e-4)


def test_a_type_the_model_cannot_give_is_refused_naming_model_kind_and_type(folders):
    for folder, kind in ((folders["splade"], "float"), (folders["splade"], "multivector")):
        with pytest.raises(InputError, match=rf"'{kind}' is not given by this model \(a splade model"):
            serve(folder, RequestOptions(embedding_types=(kind,)))


def test_a_dense_embedder_refuses_sparse_and_multivector_naming_the_type():
    from engine_lib.service.outputs import EmbeddingOutput
    from rose_wire import EMBEDDING_OUTPUTS, OUTPUTS_OF_RAGGED_TYPE, RAGGED_OUTPUTS

    output = EmbeddingOutput(384)
    for kind in ("sparse", "multivector"):
        for requested in ([], list(OUTPUTS_OF_RAGGED_TYPE[kind][:1])):
            options = output.select(RequestOptions(embedding_types=(kind,)), requested,
                                    [*EMBEDDING_OUTPUTS, *RAGGED_OUTPUTS])
            with pytest.raises(InputError, match=rf"'{kind}' is not given by this model \(a dense embedder"):
                output.check(options)


def test_compact_multivectors_are_the_float_vectors_in_float16_int8_and_sign_bits(folders):
    from rose_wire import MULTIVECTOR, MULTIVECTOR_BINARY, MULTIVECTOR_COUNTS, MULTIVECTOR_FP16, MULTIVECTOR_INT8

    kinds = ("multivector", "multivector_float16", "multivector_int8", "multivector_binary")
    got = serve(folders["bge-m3"], RequestOptions(embedding_types=kinds))
    assert set(got) == {MULTIVECTOR, MULTIVECTOR_FP16, MULTIVECTOR_INT8, MULTIVECTOR_BINARY, MULTIVECTOR_COUNTS}
    vectors = got[MULTIVECTOR]
    assert got[MULTIVECTOR_FP16].dtype == np.float16 and got[MULTIVECTOR_INT8].dtype == np.int8
    np.testing.assert_allclose(got[MULTIVECTOR_FP16], vectors, atol=1e-3)
    assert cosine_rows(got[MULTIVECTOR_INT8], vectors).min() >= 0.99
    np.testing.assert_array_equal(np.unpackbits(got[MULTIVECTOR_BINARY], axis=1)[:, :vectors.shape[1]], vectors > 0)
    only = endpoint_select(folders["bge-m3"], [MULTIVECTOR_FP16, MULTIVECTOR_COUNTS])
    assert only == ("multivector_float16",)


def endpoint_select(folder, requested):
    from engine_lib.service.retrieval_outputs import RetrievalOutput
    from rose_wire import EMBEDDING_OUTPUTS, RAGGED_OUTPUTS

    output = RetrievalOutput("bge-m3", 64)
    return output.select(RequestOptions(), requested, [*EMBEDDING_OUTPUTS, *RAGGED_OUTPUTS]).embedding_types

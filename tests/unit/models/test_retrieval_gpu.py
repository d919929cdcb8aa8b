"""Retrieval kinds on other attention backends: BGE-M3 (dense, sparse, multi-vector), SPLADE and ColBERT
(queries with masked [MASK] expansion, whose attention plan takes key_lens) served by a runner on `masked`
(CPU) and on `varlen` (CUDA) give what the CPU runner on `sdpa`, checked against the reference libraries in
test_retrieval_reference.py and test_colbert_reference.py, gives."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.service.retrieval_outputs import split_multivector, split_sparse
from rose_wire import EMBEDDINGS
from testing.tiny_models import cosine_rows
from testing.tiny_retrieval import save_bge_m3, save_colbert, save_splade
from tests.unit.models.test_retrieval_reference import serve

DENSE, SPARSE, MULTIVECTOR = "float", "sparse", "multivector"
KINDS = {"bge-m3": (save_bge_m3, RequestOptions(embedding_types=(DENSE, SPARSE, MULTIVECTOR))),
         "splade": (save_splade, RequestOptions(embedding_types=(SPARSE,))),
         "colbert-query": (save_colbert, RequestOptions(input_type="query", embedding_types=(MULTIVECTOR,))),
         "colbert-document": (save_colbert, RequestOptions(embedding_types=(MULTIVECTOR,)))}
BACKENDS = [pytest.param("cpu", "masked", id="cpu-masked"),
            pytest.param("cuda", "varlen", id="cuda-varlen", marks=pytest.mark.gpu)]


def sparse_rows(pairs) -> np.ndarray:
    rows = np.zeros((len(pairs), 1 + max(int(indices.max(initial=0)) for indices, _ in pairs)))
    for row, (indices, values) in zip(rows, pairs):
        row[indices] = values
    return rows


@pytest.mark.parametrize("device, backend", BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_retrieval_outputs_equal_the_cpu_sdpa_runners(tmp_path, kind, device, backend):
    save, options = KINDS[kind]
    folder = save(tmp_path / kind)
    runner = ModelRunner(str(folder), device=device, dtype="float32", attention_backend=backend)
    got, want = serve(folder, options, runner=runner), serve(folder, options)
    types = options.embedding_types
    if DENSE in types:
        assert cosine_rows(got[EMBEDDINGS], want[EMBEDDINGS]).min() >= 0.999
    if SPARSE in types:
        got_rows, want_rows = sparse_rows(split_sparse(got)), sparse_rows(split_sparse(want))
        assert got_rows.shape == want_rows.shape and (want_rows.sum(1) > 0).all()
        np.testing.assert_allclose(got_rows, want_rows, rtol=1e-3, atol=1e-4)
    if MULTIVECTOR in types:
        for vectors, reference in zip(split_multivector(got), split_multivector(want), strict=True):
            assert vectors.shape == reference.shape
            assert cosine_rows(vectors, reference).min() >= 0.999

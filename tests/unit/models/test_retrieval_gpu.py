"""Retrieval kinds on other attention backends: BGE-M3 (dense, sparse, multi-vector), SPLADE and ColBERT
(queries with masked [MASK] expansion, whose attention plan takes key_lens) served by a runner on `masked`
(CPU) and on `varlen` (CUDA) give what the CPU runner on `sdpa`, checked against the reference libraries in
test_retrieval_reference.py and test_colbert_reference.py, gives."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.options import RequestOptions
from engine_lib.runner.model_runner import ModelRunner
from engine_lib.runner.self_check import MIN_COSINE
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
# varlen runs in half precision only: bf16 rows against the fp32 CPU runner's (these folders in bf16 on a CPU:
# cosine >= 0.9998 per row).
BACKENDS = [pytest.param("cpu", "float32", "masked", id="cpu-masked"),
            pytest.param("cuda", "bfloat16", "varlen", id="cuda-varlen", marks=pytest.mark.gpu)]


def sparse_rows(*answers) -> list[np.ndarray]:
    """Each answer's sparse weights as dense rows over the vocabulary ids either answer uses."""
    pairs = [split_sparse(answer) for answer in answers]
    width = 1 + max(int(indices.max(initial=0)) for answer in pairs for indices, _ in answer)
    rows = [np.zeros((len(answer), width)) for answer in pairs]
    for answer, dense in zip(pairs, rows):
        for row, (indices, values) in zip(dense, answer):
            row[indices] = values
    return rows


@pytest.mark.parametrize("device, dtype, backend", BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_retrieval_outputs_equal_the_cpu_sdpa_runners(tmp_path, kind, device, dtype, backend):
    save, options = KINDS[kind]
    folder = save(tmp_path / kind)
    runner = ModelRunner(str(folder), device=device, dtype=dtype, attention_backend=backend)
    got, want = serve(folder, options, runner=runner), serve(folder, options)
    types = options.embedding_types
    if DENSE in types:
        assert cosine_rows(got[EMBEDDINGS], want[EMBEDDINGS]).min() >= MIN_COSINE
    if SPARSE in types:
        got_rows, want_rows = sparse_rows(got, want)
        assert (want_rows.sum(1) > 0).all()
        assert cosine_rows(got_rows, want_rows).min() >= MIN_COSINE
        if dtype == "float32":
            np.testing.assert_allclose(got_rows, want_rows, rtol=1e-3, atol=1e-4)
    if MULTIVECTOR in types:
        for vectors, reference in zip(split_multivector(got), split_multivector(want), strict=True):
            assert vectors.shape == reference.shape
            assert cosine_rows(vectors, reference).min() >= MIN_COSINE

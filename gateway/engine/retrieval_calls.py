"""Calls for the retrieval kinds' ragged outputs (engine_lib/retrieval.py): dense, sparse and multi-vector
from one encoder request per chunk of texts, concatenated in text order.

The ragged tensors have no row per text, so a call names no row count; the per-text counts are checked
here instead (one per text of the chunk, adding up to the values sent)."""
from __future__ import annotations

import functools

import numpy as np

from engine_lib.model_folder import ModelFolder
from engine_lib.retrieval import OFFERED, retrieval_kind

from engine_lib.contract import RaggedTokens
from engine_lib.service.retrieval_outputs import TENSORS_OF_TYPE, split_multivector, split_sparse
from rose_client.aio_stream import Call
from rose_client.chunking import Chunk, plan_chunks
from rose_wire import EMBEDDINGS, INPUT_IDS, MULTIVECTOR, MULTIVECTOR_COUNTS, SEQ_LENS, SPARSE_COUNTS, SPARSE_INDICES



@functools.lru_cache(maxsize=None)
def kind_of(model_dir: str) -> str | None:
    """The retrieval kind of a model folder (engine_lib/retrieval.py), None for a dense embedder."""
    return retrieval_kind(ModelFolder.open(model_dir))


def offered_types(model_dir: str) -> tuple[str, ...] | None:
    """The embedding types a retrieval model gives (engine_lib/retrieval.py), None for a dense embedder."""
    kind = kind_of(model_dir)
    return OFFERED[kind] if kind else None


def _check(part: dict[str, np.ndarray], num_texts: int) -> None:
    for counts, values in ((SPARSE_COUNTS, SPARSE_INDICES), (MULTIVECTOR_COUNTS, MULTIVECTOR)):
        if counts in part and (len(part[counts]) != num_texts or int(part[counts].sum()) != len(part[values])):
            raise ValueError(f"the encoder answered {counts} {part[counts].tolist()} for {num_texts} texts "
                             f"and {len(part[values])} entries")
    if EMBEDDINGS in part and len(part[EMBEDDINGS]) != num_texts:
        raise ValueError(f"the encoder answered {len(part[EMBEDDINGS])} embeddings for {num_texts} texts")


async def embed_retrieval(backend, tokens: RaggedTokens, types: list[str], parameters: dict, encoder: str) -> dict:
    """-> {"float": [N, D] array, "sparse": [(indices, values)] per text, "multivector": [[T, D] array] per
    text} for `types` (engine_lib.retrieval names); `parameters`: the encoder's (dimensions, sparse_top_k,
    input_type: a ColBERT model encodes queries and documents differently)."""
    names = tuple(n for t in types for n in TENSORS_OF_TYPE[t])
    parameters = {**parameters, "embedding_types": ",".join(types)}
    chunks = plan_chunks(tokens.seq_lens.tolist(), backend.config.max_chunk_tokens, backend.config.max_chunk_texts)
    offsets = tokens.offsets

    def call(chunk: Chunk) -> Call:
        ids = tokens.input_ids[offsets[chunk.start]:offsets[chunk.stop]]
        return Call(encoder, {INPUT_IDS: ids, SEQ_LENS: tokens.seq_lens[chunk.start:chunk.stop]}, names[0],
                    parameters, outputs=names)

    backend.metrics.chunks.labels("embed_v2").inc(len(chunks))
    parts = await backend.dispatcher.run(chunks, call)
    for chunk, part in zip(chunks, parts):
        _check(part, chunk.num_texts)
    out = {}
    if "float" in types:
        out["float"] = np.concatenate([p[EMBEDDINGS] for p in parts])
    if "sparse" in types:
        out["sparse"] = [pair for p in parts for pair in split_sparse(p)]
    if "multivector" in types:
        out["multivector"] = [vectors for p in parts for vectors in split_multivector(p)]
    return out


def late_interaction_scores(outputs: dict, weights: list[float] | None, reduce: str = "mean") -> np.ndarray:
    """Scores of texts 1.. (documents) against text 0 (the query) from embed_retrieval's `outputs`, as
    FlagEmbedding's BGE-M3 compute_score makes them: MaxSim (the mean over the query's token vectors of
    their best dot product with the document's; `reduce` "sum": their sum, as PyLate's colbert_scores);
    with `weights` [dense, sparse, multivector], the weighted mean of the dense dot product, the lexical
    score (the sum of shared tokens' weight products) and MaxSim."""
    query, documents = outputs["multivector"][0], outputs["multivector"][1:]
    best = [(query.astype(np.float64) @ d.T).max(1) for d in documents]
    maxsim = np.array([b.sum() if reduce == "sum" else b.mean() for b in best])
    if weights is None:
        return maxsim
    dense = outputs["float"][1:].astype(np.float64) @ outputs["float"][0].astype(np.float64)
    q_ids, q_values = outputs["sparse"][0]
    lexical = []
    for ids, values in outputs["sparse"][1:]:
        _, qi, di = np.intersect1d(q_ids, ids, assume_unique=True, return_indices=True)
        lexical.append(float((q_values[qi].astype(np.float64) * values[di]).sum()))
    w_dense, w_sparse, w_multi = weights
    return (w_dense * dense + w_sparse * np.array(lexical) + w_multi * maxsim) / sum(weights)

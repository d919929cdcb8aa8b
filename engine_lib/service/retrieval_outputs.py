"""What a retrieval model (engine_lib/retrieval.py) answers: any of dense, sparse and multi-vector
outputs from the same rows (one TextOutputs per text), ragged over the texts.

- float: EMBEDDINGS FP32 [N, H] (Matryoshka cut, then normalised, as EmbeddingOutput does);
- sparse: SPARSE_INDICES INT64 [K], SPARSE_VALUES FP32 [K], SPARSE_COUNTS INT64 [N]; indices
  ascending within a text; `sparse_top_k` keeps a text's k largest weights;
- multivector: MULTIVECTOR FP32 [T, D] (every kept token vector, normalised), MULTIVECTOR_COUNTS INT64 [N];
  multivector_float16 / _int8 / _binary: the same vectors as MULTIVECTOR_FP16, MULTIVECTOR_INT8
  (round(127 x component): unit vectors need no calibration) or MULTIVECTOR_BINARY (packed sign bits).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from engine_lib.errors import InputError
from engine_lib.options import RequestOptions
from engine_lib.retrieval import DENSE, MULTIVECTOR, OFFERED, SPARSE, TextOutputs
from engine_lib.service.outputs import finish_rows
from engine_lib.service.quantize import pack_signs
from rose_wire import EMBEDDINGS
from rose_wire.names import (MULTIVECTOR as MULTIVECTOR_TENSOR, MULTIVECTOR_BINARY, MULTIVECTOR_COUNTS,
                             MULTIVECTOR_FP16, MULTIVECTOR_INT8, OUTPUTS_OF_RAGGED_TYPE, SPARSE_COUNTS,
                             SPARSE_INDICES, SPARSE_VALUES)

TENSORS_OF_TYPE = {DENSE: (EMBEDDINGS,), **OUTPUTS_OF_RAGGED_TYPE}
COMPACT = {"multivector_float16": (MULTIVECTOR_FP16, lambda v: v.astype(np.float16)),
           "multivector_int8": (MULTIVECTOR_INT8, lambda v: np.clip(np.rint(v * 127), -127, 127).astype(np.int8)),
           "multivector_binary": (MULTIVECTOR_BINARY, lambda v: pack_signs(v, signed=False))}
# a requested tensor -> the type it asks for (the counts come with every multi-vector type: no type of their own)
TYPE_OF_TENSOR = {tensor: kind for kind, tensors in TENSORS_OF_TYPE.items() for tensor in tensors
                  if tensor != MULTIVECTOR_COUNTS}


def top_k(indices: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest weights (ties: the smaller id), indices still ascending; k = 0: all."""
    if not k or len(values) <= k:
        return indices, values
    keep = np.sort(np.lexsort((indices, -values))[:k])
    return indices[keep], values[keep]


def sparse_tensors(texts: Sequence[TextOutputs], k: int = 0) -> dict[str, np.ndarray]:
    pairs = [top_k(t.sparse_indices, t.sparse_values, k) for t in texts]
    return {SPARSE_INDICES: np.concatenate([p[0] for p in pairs]).astype(np.int64),
            SPARSE_VALUES: np.concatenate([p[1] for p in pairs]).astype(np.float32),
            SPARSE_COUNTS: np.array([len(p[0]) for p in pairs], dtype=np.int64)}


def multivector_tensors(texts: Sequence[TextOutputs], kind: str = MULTIVECTOR) -> dict[str, np.ndarray]:
    vectors = np.ascontiguousarray(np.concatenate([t.multivector for t in texts]), dtype=np.float32)
    name, convert = COMPACT.get(kind, (MULTIVECTOR_TENSOR, lambda v: v))
    return {name: np.ascontiguousarray(convert(vectors)),
            MULTIVECTOR_COUNTS: np.array([len(t.multivector) for t in texts], dtype=np.int64)}


def split_sparse(tensors: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """SPARSE_* tensors back to one (indices, values) pair per text (clients, tests)."""
    bounds = np.concatenate([[0], np.cumsum(tensors[SPARSE_COUNTS])])
    return [(tensors[SPARSE_INDICES][a:b], tensors[SPARSE_VALUES][a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def split_multivector(tensors: dict[str, np.ndarray]) -> list[np.ndarray]:
    bounds = np.concatenate([[0], np.cumsum(tensors[MULTIVECTOR_COUNTS])])
    return [tensors[MULTIVECTOR_TENSOR][a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class RetrievalOutput:
    """The answer of a retrieval kind; the types a request gets are checked against what the kind offers."""

    name = EMBEDDINGS
    options_type = RequestOptions

    def __init__(self, kind: str, dense_width: int):
        self.kind, self.width, self.offered = kind, dense_width, OFFERED[kind]

    def select(self, options: RequestOptions, requested: Sequence[str], declared: Sequence[str]) -> RequestOptions:
        """Types from the outputs the client named (when it named some of the declared ones), else from
        `embedding_types`, else the kind's first type (dense for BGE-M3, sparse for SPLADE)."""
        if requested and set(requested) != set(declared):
            kinds = tuple(dict.fromkeys(TYPE_OF_TENSOR[n] for n in requested if n in TYPE_OF_TENSOR))
        else:
            kinds = options.embedding_types
        return dataclasses.replace(options, embedding_types=kinds or self.offered[:1])

    def check(self, options: RequestOptions) -> None:
        for kind in options.embedding_types:
            if kind not in self.offered:
                raise InputError(f"embedding type {kind!r} is not given by this model (a {self.kind} model gives "
                                 f"{list(self.offered)})", "embedding_types")
        if options.chunking != "none":
            raise InputError(f"chunking={options.chunking!r} is not supported by a {self.kind} model", "chunking")
        options.check_width(self.width if DENSE in self.offered else 0)

    @staticmethod
    def needs_ranges(options: RequestOptions) -> bool:
        return False

    @staticmethod
    def only_ranges(options: RequestOptions) -> bool:
        return False

    def answer(self, rows: np.ndarray, options: RequestOptions, calibration=None) -> dict[str, np.ndarray]:
        texts = [row[0] for row in rows]
        out = {}
        for kind in options.embedding_types or self.offered[:1]:
            if kind == DENSE:
                out[EMBEDDINGS] = finish_rows(np.stack([t.dense for t in texts]), options)
            elif kind == SPARSE:
                out.update(sparse_tensors(texts, options.sparse_top_k))
            elif kind == MULTIVECTOR or kind in COMPACT:
                out.update(multivector_tensors(texts, kind))
        return out

"""A retrieval head's device outputs (models/retrieval_heads.py) -> one `TextOutputs` per sequence.

The step's result resolves to an object array [num_seqs, 1] of TextOutputs (retrieval.ROW_DTYPE),
so the service delivers it per sequence like any row. On CUDA an event after the head tells when
the outputs are ready; they are copied to the host on `wait()` (only what the head kept: SPLADE's
nonzeros, never its vocabulary-wide rows).
"""
from __future__ import annotations

import numpy as np

from engine_lib.contract import PackedBatch
from engine_lib.retrieval import ROW_DTYPE, TextOutputs, pool_token_weights


def m3_rows(out: dict[str, np.ndarray], batch: PackedBatch, dropped_ids: np.ndarray) -> list[TextOutputs]:
    cu = batch.cu_seqlens.astype(np.int64)
    rows = []
    for i in range(batch.num_seqs):
        start, stop = cu[i], cu[i + 1]
        indices, values = pool_token_weights(batch.input_ids[start:stop], out["token_weights"][start:stop],
                                             dropped_ids)
        rows.append(TextOutputs(dense=out["dense"][i], sparse_indices=indices, sparse_values=values,
                                multivector=out["multivector"][start + 1:stop]))  # every token after CLS
    return rows


def colbert_rows(out: dict[str, np.ndarray], batch: PackedBatch, skiplist_ids: np.ndarray) -> list[TextOutputs]:
    """A query's token vectors all (its expansion included), a document's but those of skiplist tokens."""
    cu = batch.cu_seqlens.astype(np.int64)
    rows = []
    for i in range(batch.num_seqs):
        vectors = out["multivector"][cu[i]:cu[i + 1]]
        if batch.queries is None or not batch.queries[i]:
            vectors = vectors[~np.isin(batch.input_ids[cu[i]:cu[i + 1]], skiplist_ids)]
        rows.append(TextOutputs(multivector=vectors))
    return rows


def expansion_key_lens(batch: PackedBatch, expansion_id: int) -> np.ndarray | None:
    """Keys per sequence when no token attends to a query's expansion (PyLate's attention mask with
    attend_to_expansion_tokens false): a query's tokens before its trailing expansion tokens (the
    tokenizer ends every text with its own special token, so a text's own tokens are never trailing)."""
    if batch.queries is None:
        return None
    cu = batch.cu_seqlens.astype(np.int64)
    key_lens = np.diff(cu)
    for i in np.flatnonzero(batch.queries):
        ids = batch.input_ids[cu[i]:cu[i + 1]]
        own = np.flatnonzero(ids != expansion_id)
        key_lens[i] = own[-1] + 1 if len(own) else len(ids)
    return key_lens


def splade_rows(out: dict[str, np.ndarray], batch: PackedBatch) -> list[TextOutputs]:
    bounds = np.searchsorted(out["rows"], np.arange(batch.num_seqs + 1))
    return [TextOutputs(sparse_indices=out["cols"][a:b].astype(np.int64), sparse_values=out["values"][a:b])
            for a, b in zip(bounds[:-1], bounds[1:])]


def as_rows(outputs: list[TextOutputs]) -> np.ndarray:
    rows = np.empty((len(outputs), 1), dtype=ROW_DTYPE)
    for i, text in enumerate(outputs):
        rows[i, 0] = text
    return rows


class RaggedResult:
    """LazyTensor over a head's device outputs; `build(host outputs) -> list[TextOutputs]`."""

    def __init__(self, device_outputs: dict, build):
        self._outputs, self._build, self._event = device_outputs, build, None
        first = next(iter(device_outputs.values()))
        if first.device.type == "cuda":
            import torch

            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(first.device))

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> np.ndarray:
        if self._event is not None:
            self._event.synchronize()
        host = {name: tensor.cpu().numpy() for name, tensor in self._outputs.items()}
        self._outputs = None
        return as_rows(self._build(host))

"""service.batching.gather: scheduled sequences -> one PackedBatch from slices of the requests' flat ids."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine_lib.contract import RaggedTokens
from engine_lib.service.batching import gather
from engine_lib.service.scheduler import PriorityBatcher


def request(ids, token_types=None):
    tokens = RaggedTokens(np.array(ids, dtype=np.int64), np.array([len(ids)], dtype=np.int64),
                          None if token_types is None else np.array(token_types, dtype=np.int64))
    return SimpleNamespace(tokens=tokens)


def test_batches_cut_through_requests_and_mix_token_types():
    requests = {"a": request([1, 2, 3, 4, 5]), "b": request([6, 7, 8, 9], [0, 1, 1, 0]), "c": request([10, 11])}
    batcher = PriorityBatcher(max_batch_tokens=100, max_batch_sequences=3)
    for key, lens in (("a", [2, 3]), ("b", [1, 3]), ("c", [2])):
        batcher.add(key, lens)
    first, second = batcher.next_batch(), batcher.next_batch()  # a0 a1 b0 | b1 c0
    batch = gather(first, [requests[s.request_key] for s in first])
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 6] and batch.cu_seqlens.tolist() == [0, 2, 5, 6]
    assert batch.positions.tolist() == [0, 1, 0, 1, 2, 0] and batch.token_types.tolist() == [0] * 6
    batch = gather(second, [requests[s.request_key] for s in second])
    assert batch.input_ids.tolist() == [7, 8, 9, 10, 11] and batch.cu_seqlens.tolist() == [0, 3, 5]
    assert batch.token_types.tolist() == [1, 1, 0, 0, 0] and batch.max_seqlen == 3


def test_one_request_is_taken_without_a_copy():
    r = request([4, 5, 6, 7, 8, 9])
    batcher = PriorityBatcher(max_batch_tokens=4, max_batch_sequences=8)
    batcher.add("r", [1, 2, 3])
    scheduled = batcher.next_batch()  # the first two sequences: 3 tokens, the third would pass the budget
    batch = gather(scheduled, [r] * len(scheduled))
    assert batch.input_ids.tolist() == [4, 5, 6] and batch.token_types is None
    assert np.shares_memory(batch.input_ids, r.tokens.input_ids)

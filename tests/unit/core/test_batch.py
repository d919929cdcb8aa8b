"""PackedBatch: flat ids, per-sequence positions and cu_seqlens, no padding."""
from __future__ import annotations

import numpy as np
import pytest

from engine_lib.contract import PackedBatch


def test_packing_three_sequences():
    batch = PackedBatch.from_sequences([np.array([5, 6, 7]), np.array([8]), np.array([9, 10])])
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert batch.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 6] and batch.cu_seqlens.dtype == np.int32
    assert batch.seq_ids.tolist() == [0, 0, 0, 1, 2, 2]
    assert (batch.num_seqs, batch.num_tokens, batch.max_seqlen) == (3, 6, 3)
    assert batch.seq_lens.tolist() == [3, 1, 2]


@pytest.mark.parametrize("sequences, message", [([], "at least one sequence"), ([np.array([1]), np.array([])], "at least one token")])
def test_empty_batches_and_sequences_are_refused(sequences, message):
    with pytest.raises(ValueError, match=message):
        PackedBatch.from_sequences(sequences)

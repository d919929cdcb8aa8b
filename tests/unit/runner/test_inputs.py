"""runner/inputs.py: a PackedBatch's [4, num_tokens] token buffer and cu_seqlens, plain and padded to a bucket."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_lib.contract import PackedBatch
from engine_lib.runner.inputs import host_inputs, step_inputs

CPU = torch.device("cpu")


def test_rows_of_an_unpadded_batch():
    batch = PackedBatch.from_sequences([np.array([5, 6, 7]), np.array([8, 9])], [None, np.array([0, 1])])
    inputs = step_inputs(batch, CPU)
    ids, positions, seq_ids, token_types = inputs.token_data.numpy()
    assert inputs.token_data.dtype == torch.int64 and inputs.cu_seqlens.dtype == torch.int32
    assert ids.tolist() == [5, 6, 7, 8, 9] and positions.tolist() == [0, 1, 2, 0, 1]
    assert seq_ids.tolist() == [0, 0, 0, 1, 1] and token_types.tolist() == [0, 0, 0, 0, 1]
    assert inputs.cu_seqlens.tolist() == inputs.host.cu_seqlens.tolist() == [0, 3, 5]


def test_padding_uses_zero_length_dummies_and_the_scratch_row():
    batch = PackedBatch.from_sequences([np.array([5, 6, 7]), np.array([8, 9])])
    padded = host_inputs(batch, pad_to=(4, 64))
    assert padded.cu_seqlens.tolist() == [0, 3, 5, 5, 5]
    ids, positions, seq_ids, token_types = padded.token_data
    assert not token_types.any()
    assert ids[:5].tolist() == [5, 6, 7, 8, 9] and not ids[5:].any()
    assert positions[:5].tolist() == [0, 1, 2, 0, 1] and not positions[5:].any()
    assert seq_ids[:5].tolist() == [0, 0, 0, 1, 1] and (seq_ids[5:] == 4).all()  # scratch row = bucket size
    with pytest.raises(ValueError, match="exceeds bucket"):
        host_inputs(batch, pad_to=(1, 64))


def test_copies_into_static_buffers():
    """Graph replay: the padded inputs land in the given buffers (views of the static ones)."""
    token_buffer, cu_buffer = torch.full((4, 128), -1, dtype=torch.int64), torch.full((9,), -1, dtype=torch.int32)
    batch = PackedBatch.from_sequences([np.array([3, 4]), np.array([5])])
    static = token_buffer[:, :64], cu_buffer[:5]
    inputs = step_inputs(batch, CPU, pad_to=(4, 64), out=static)
    assert inputs.token_data is static[0] and inputs.cu_seqlens is static[1]
    np.testing.assert_array_equal(token_buffer[:, :64].numpy(), host_inputs(batch, pad_to=(4, 64)).token_data)
    assert cu_buffer.tolist() == [0, 2, 3, 3, 3, -1, -1, -1, -1]
    assert (token_buffer[:, 64:] == -1).all()

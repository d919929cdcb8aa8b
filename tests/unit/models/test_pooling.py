"""Pooling over packed tokens: each mode against a per-sequence computation, graph padding ignored."""
from __future__ import annotations

import pytest
import torch

from engine_lib.models.pooling import pool

LENS = [3, 1, 4]


def packed(pad_tokens=0):
    torch.manual_seed(0)
    hidden = torch.randn(sum(LENS) + pad_tokens, 5)
    cu_seqlens = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    seq_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(LENS))
    seq_ids = torch.cat([seq_ids, torch.full((pad_tokens,), 3)])  # padding -> the scratch row
    return hidden, cu_seqlens, seq_ids


@pytest.mark.parametrize("pad_tokens", [0, 5])
def test_modes_match_per_sequence_reference(pad_tokens):
    hidden, cu_seqlens, seq_ids = packed(pad_tokens)
    pieces = torch.split(hidden[:sum(LENS)], LENS)
    torch.testing.assert_close(pool(hidden, cu_seqlens, seq_ids, "mean"), torch.stack([p.mean(0) for p in pieces]))
    torch.testing.assert_close(pool(hidden, cu_seqlens, seq_ids, "cls"), torch.stack([p[0] for p in pieces]))
    torch.testing.assert_close(pool(hidden, cu_seqlens, seq_ids, "lasttoken"), torch.stack([p[-1] for p in pieces]))


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown pooling mode 'max'"):
        pool(*packed(), "max")

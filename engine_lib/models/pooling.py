"""Sequence pooling over packed tokens (the mode comes from ModelFolder.pooling)."""
from __future__ import annotations

import torch


def pool(hidden, cu_seqlens, seq_ids, mode: str):
    """hidden [num_tokens, H] -> [num_seqs, H]; seq_ids [num_tokens] maps token -> sequence.

    Graph padding: tokens past cu_seqlens[-1] carry seq_id == num_seqs (a scratch
    row that is dropped); zero-length dummy sequences give rows nobody reads (indices
    are clamped so they stay in bounds).
    """
    num_seqs = cu_seqlens.shape[0] - 1
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long().clamp(max=hidden.shape[0] - 1)]
    if mode == "lasttoken":
        return hidden[cu_seqlens[1:].long() - 1]
    if mode == "mean":
        sums = torch.zeros(num_seqs + 1, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seq_ids, hidden.float())
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.float32).unsqueeze(1)
        return sums[:num_seqs] / lens
    raise ValueError(f"unknown pooling mode {mode!r}")

"""Block-diagonal masked SDPA over all packed tokens: graph-capturable on any device.

Costs O(num_tokens^2) memory per layer, so it suits small batches; it is the
graph-capable reference on CPU (tests of graph bookkeeping use it). `auto`
never picks it: without a flash kernel the GPU runs `sdpa` (docs/engine.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine_lib.device.lazy_tensor import host_tensor

PAD_SEQ_ID = -1  # graph padding tokens form one extra block among themselves


def token_seq_ids(cu_seqlens: np.ndarray, num_tokens: int) -> np.ndarray:
    """[num_tokens] sequence index per token; tokens past cu_seqlens[-1] get PAD_SEQ_ID."""
    seq_ids = np.full(num_tokens, PAD_SEQ_ID, dtype=np.int64)
    lens = np.diff(cu_seqlens).astype(np.int64)
    seq_ids[:int(cu_seqlens[-1])] = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return seq_ids


@dataclass(frozen=True)
class MaskedPlan:
    seq_ids: torch.Tensor  # [num_tokens] int64 on the device
    keys: torch.Tensor | None = None  # [num_tokens] bool: the token is a key (key_lens); None = all are


class MaskedSdpaBackend:
    name = "masked"
    supports_graphs = True
    graph_keys_max_seqlen = False

    def __init__(self, causal: bool):
        self.causal = causal

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device,
             key_lens: np.ndarray | None = None) -> MaskedPlan:
        """`key_lens`: sequence i's tokens attend to its first key_lens[i] tokens only."""
        seq_ids = token_seq_ids(cu_seqlens, int(cu_seqlens[-1]))
        keys = None
        if key_lens is not None:
            lens = np.diff(cu_seqlens).astype(np.int64)
            positions = np.arange(len(seq_ids)) - np.repeat(cu_seqlens[:-1].astype(np.int64), lens)
            keys = host_tensor(positions < np.repeat(np.asarray(key_lens, dtype=np.int64), lens), device)
            keys = keys.to(device, non_blocking=True)
        return MaskedPlan(host_tensor(seq_ids, device).to(device, non_blocking=True), keys)

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int) -> MaskedPlan:
        return MaskedPlan(torch.full((num_tokens,), PAD_SEQ_ID, dtype=torch.int64, device=device))

    def update_graph_plan(self, plan: MaskedPlan, cu_seqlens: np.ndarray) -> None:
        seq_ids = token_seq_ids(cu_seqlens, plan.seq_ids.shape[0])
        plan.seq_ids.copy_(host_tensor(seq_ids, plan.seq_ids.device), non_blocking=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: MaskedPlan) -> torch.Tensor:
        mask = plan.seq_ids[:, None] == plan.seq_ids[None, :]  # [num_tokens, num_tokens]
        if plan.keys is not None:
            mask = mask & plan.keys[None, :]
        if self.causal:
            mask = mask.tril()
        # [num_tokens, heads, dim] -> [1, heads, num_tokens, dim]
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
        return out.squeeze(0).transpose(0, 1)

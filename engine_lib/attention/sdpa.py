"""Ragged attention with torch SDPA, without padding.

Sequences of equal length are gathered into one dense [group, heads, len, dim]
call; no token is ever padded and no cross-sequence mask is materialised. The
plan's shapes depend on the batch's lengths, so this backend runs eagerly only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine_lib.device.lazy_tensor import host_tensor


@dataclass(frozen=True)
class SdpaPlan:
    groups: tuple[torch.Tensor, ...]  # each [num_seqs_in_group, seq_len] token indices


class SdpaBackend:
    name = "sdpa"
    supports_graphs = False
    graph_keys_max_seqlen = False

    def __init__(self, causal: bool):
        self.causal = causal

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device) -> SdpaPlan:
        starts = cu_seqlens[:-1].astype(np.int64)
        lens = np.diff(cu_seqlens).astype(np.int64)
        groups = []
        for length in np.unique(lens):
            group_starts = starts[lens == length]
            index = group_starts[:, None] + np.arange(length, dtype=np.int64)[None, :]
            groups.append(host_tensor(index, device).to(device, non_blocking=True))
        return SdpaPlan(tuple(groups))

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int):
        raise NotImplementedError("the sdpa backend's plan depends on sequence lengths; it cannot be graphed")

    def update_graph_plan(self, plan, cu_seqlens: np.ndarray) -> None:
        raise NotImplementedError("the sdpa backend cannot be graphed")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        if len(plan.groups) == 1:
            # Every sequence has the same length and they are packed in order: a view, no gather/scatter.
            num_seqs, length = plan.groups[0].shape
            qg, kg, vg = (t.unflatten(0, (num_seqs, length)).transpose(1, 2) for t in (q, k, v))
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=self.causal, enable_gqa=gqa)
            return og.transpose(1, 2).flatten(0, 1)
        out = torch.empty_like(q)
        for index in plan.groups:
            # [group, len, heads, dim] -> [group, heads, len, dim]
            qg, kg, vg = (t[index].transpose(1, 2) for t in (q, k, v))
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=self.causal, enable_gqa=gqa)
            out[index] = og.transpose(1, 2)
        return out

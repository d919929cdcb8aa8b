"""Ragged attention with torch SDPA, without padding.

Sequences of equal length are gathered into one dense [group, heads, len, dim]
call; no token is ever padded and no cross-sequence mask is materialised. The
plan's shapes depend on the batch's lengths, so this backend runs eagerly only.
With `key_lens`, sequence i's tokens attend to its first key_lens[i] tokens only (grouped by both).
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
    key_lens: tuple[int, ...] = ()    # per group: keys are the first key_len tokens (); () = all


class SdpaBackend:
    name = "sdpa"
    supports_graphs = False
    graph_keys_max_seqlen = False

    def __init__(self, causal: bool):
        self.causal = causal

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device,
             key_lens: np.ndarray | None = None) -> SdpaPlan:
        starts = cu_seqlens[:-1].astype(np.int64)
        lens = np.diff(cu_seqlens).astype(np.int64)
        if key_lens is None:  # by length alone: 1-D unique, several times cheaper than unique rows
            return SdpaPlan(tuple(self._group(starts, lens == length, length, device) for length in np.unique(lens)))
        keys = np.asarray(key_lens, dtype=np.int64)
        pairs = np.unique(np.stack([lens, keys], axis=1), axis=0)
        return SdpaPlan(tuple(self._group(starts, (lens == length) & (keys == key_len), length, device)
                              for length, key_len in pairs), tuple(int(key_len) for _, key_len in pairs))

    @staticmethod
    def _group(starts: np.ndarray, members: np.ndarray, length: int, device: torch.device) -> torch.Tensor:
        """[members, length] token indices of the sequences starting at starts[members]."""
        index = starts[members][:, None] + np.arange(length, dtype=np.int64)[None, :]
        return host_tensor(index, device).to(device, non_blocking=True)

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int):
        raise NotImplementedError("the sdpa backend's plan depends on sequence lengths; it cannot be graphed")

    def update_graph_plan(self, plan, cu_seqlens: np.ndarray) -> None:
        raise NotImplementedError("the sdpa backend cannot be graphed")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        if plan.key_lens:
            return self._forward_key_lens(q, k, v, plan, gqa)
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

    def _forward_key_lens(self, q, k, v, plan: SdpaPlan, gqa: bool) -> torch.Tensor:
        out = torch.empty_like(q)
        for index, key_len in zip(plan.groups, plan.key_lens):
            keys = index[:, :key_len]
            qg, kg, vg = (t[i].transpose(1, 2) for t, i in ((q, index), (k, keys), (v, keys)))
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=self.causal, enable_gqa=gqa)
            out[index] = og.transpose(1, 2)
        return out

"""torch's own ragged FlashAttention (`torch.nn.attention.varlen.varlen_attn`), CUDA only.

Signatures differ across torch releases (`is_causal=` in early ones,
`window_size=(-1, 0)` later, and a Python-side head check that wants
`enable_gqa=True` in the newest); the backend adapts once at construction. Its plan is cu_seqlens on the device plus an int max_seqlen, so
a graph's plan is a static cu_seqlens buffer and the bucket's token count.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from engine_lib.device.lazy_tensor import host_tensor


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_available(device: torch.device) -> bool:
    if device.type != "cuda" or _varlen_attn() is None:
        return False
    flash = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    return flash and torch.cuda.get_device_capability(device)[0] >= 8


@dataclass(frozen=True)
class VarlenPlan:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32 on the device
    max_seqlen: int           # an upper bound is fine: it only sizes the launch grid
    # key_lens (eager only): the key tokens' indices, their cu_seqlens and longest run; None = every token
    key_index: torch.Tensor | None = None
    cu_keys: torch.Tensor | None = None
    max_keys: int = 0


class VarlenBackend:
    name = "varlen"
    supports_graphs = True
    graph_keys_max_seqlen = True

    def __init__(self, causal: bool):
        self._attn = _varlen_attn()
        if self._attn is None:
            raise ValueError("this torch has no torch.nn.attention.varlen.varlen_attn")
        params = inspect.signature(self._attn).parameters
        self._kwargs = {}
        if causal and "window_size" in params:
            self._kwargs["window_size"] = (-1, 0)
        elif causal:
            self._kwargs["is_causal"] = True
        self._native_gqa = "enable_gqa" in params

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device,
             key_lens: np.ndarray | None = None) -> VarlenPlan:
        """`key_lens`: sequence i's tokens attend to its first key_lens[i] tokens only (UNVERIFIED on a GPU)."""
        cu = host_tensor(cu_seqlens.astype(np.int32, copy=False), device).to(device, non_blocking=True)
        if key_lens is None:
            return VarlenPlan(cu, int(max_seqlen))
        key_lens = np.asarray(key_lens, dtype=np.int64)
        starts = cu_seqlens[:-1].astype(np.int64)
        index = np.concatenate([np.arange(a, a + n) for a, n in zip(starts, key_lens)])
        cu_keys = np.concatenate([[0], np.cumsum(key_lens)]).astype(np.int32)
        return VarlenPlan(cu, int(max_seqlen), host_tensor(index, device).to(device, non_blocking=True),
                          host_tensor(cu_keys, device).to(device, non_blocking=True), int(key_lens.max()))

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int) -> VarlenPlan:
        # max_seqlen is the graph's bucket (>= every batch it replays): it sizes the launch grid.
        return VarlenPlan(torch.zeros(num_seqs + 1, dtype=torch.int32, device=device), max_seqlen)

    def update_graph_plan(self, plan: VarlenPlan, cu_seqlens: np.ndarray) -> None:
        plan.cu_seqlens.copy_(host_tensor(cu_seqlens.astype(np.int32, copy=False), plan.cu_seqlens.device),
                              non_blocking=True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan) -> torch.Tensor:
        # K/V with fewer heads go straight to the kernel (FlashAttention groups query heads itself);
        # releases that check head counts in Python ask for enable_gqa=True.
        kwargs = self._kwargs
        if q.shape[1] != k.shape[1] and self._native_gqa:
            kwargs = {**kwargs, "enable_gqa": True}
        if plan.key_index is not None:
            k, v = k.index_select(0, plan.key_index), v.index_select(0, plan.key_index)
            return self._attn(q, k, v, plan.cu_seqlens, plan.cu_keys, plan.max_seqlen, plan.max_keys, **kwargs)
        return self._attn(q, k, v, plan.cu_seqlens, plan.cu_seqlens, plan.max_seqlen, plan.max_seqlen, **kwargs)

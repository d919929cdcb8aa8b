"""Attention backends over packed ragged tokens: plan outside, run inside.

A backend turns batch geometry into a plan once per batch (host work, outside
any CUDA graph) and then runs `forward(q, k, v, plan)` per layer on
q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim].
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from .sdpa import SdpaBackend


class AttentionBackend(Protocol):
    name: str

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device) -> Any: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> torch.Tensor: ...


def select_backend(name: str, device: torch.device, causal: bool) -> AttentionBackend:
    """Pick a backend: `auto` means SDPA (the one backend verified on every device)."""
    if name in ("auto", "sdpa"):
        return SdpaBackend(causal=causal)
    raise ValueError(f"unknown attention_backend {name!r}; available: auto, sdpa")

"""Attention backends over packed ragged tokens: plan outside, run inside.

A backend turns batch geometry into a plan (host work, outside any CUDA graph)
and then runs `forward(q, k, v, plan)` per layer on q [num_tokens, num_heads,
head_dim], k/v [num_tokens, num_kv_heads, head_dim]. Graph-capable backends
also make a static plan per graph (`graph_plan`) whose device buffers are
rewritten before each replay (`update_graph_plan`); that cu_seqlens may end in
zero-length dummy sequences and the tokens past cu_seqlens[-1] are padding.

Rule for `auto` (docs/engine.md): on CPU, or in fp32, `sdpa`. On CUDA in
fp16/bf16 with a head_dim flash kernels take (multiple of 8, <= 256): torch's
FlashAttention varlen (`varlen`) when this torch has it, else FlashInfer
(`flashinfer`) when installed and head_dim is 64/128/256, else `sdpa`.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from engine_lib.attention.masked import MaskedSdpaBackend
from engine_lib.attention.sdpa import SdpaBackend
from engine_lib.attention.varlen import VarlenBackend, varlen_available

BACKENDS = ("auto", "sdpa", "masked", "varlen", "flashinfer")
HALF_DTYPES = (torch.float16, torch.bfloat16)


class AttentionBackend(Protocol):
    name: str
    supports_graphs: bool
    graph_keys_max_seqlen: bool  # graphs are also keyed by a max_seqlen bucket (the launch grid depends on it)

    def plan(self, cu_seqlens: np.ndarray, max_seqlen: int, device: torch.device,
             key_lens: np.ndarray | None = None) -> Any:
        """`key_lens` [num_seqs] (eager only): sequence i's tokens attend to its first key_lens[i] tokens
        only (ColBERT's query expansion); flashinfer refuses it."""
        ...

    def graph_plan(self, num_seqs: int, num_tokens: int, device: torch.device, max_seqlen: int) -> Any: ...

    def update_graph_plan(self, plan: Any, cu_seqlens: np.ndarray) -> None: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Any) -> torch.Tensor: ...


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool

    @classmethod
    def from_config(cls, cfg: dict, causal: bool) -> "AttentionShape":
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        return cls(num_heads, cfg.get("num_key_value_heads") or num_heads, head_dim, causal)


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def _flash_shape_ok(device: torch.device, dtype: torch.dtype, shape: AttentionShape) -> bool:
    return (device.type == "cuda" and dtype in HALF_DTYPES
            and shape.head_dim % 8 == 0 and shape.head_dim <= 256)


def auto_backend_name(device: torch.device, dtype: torch.dtype, shape: AttentionShape) -> str:
    if not _flash_shape_ok(device, dtype, shape):
        return "sdpa"
    if varlen_available(device):
        return "varlen"
    if flashinfer_available() and shape.head_dim in (64, 128, 256):
        return "flashinfer"
    return "sdpa"


def select_backend(name: str, device: torch.device, dtype: torch.dtype, shape: AttentionShape,
                   key_lens: bool = False) -> AttentionBackend:
    """The backend `name` asks for (`auto`: the rule above; with `key_lens`, a model that needs them,
    never flashinfer), or a ValueError saying why not."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention_backend {name!r}; available: {', '.join(BACKENDS)}")
    if name == "auto":
        name = auto_backend_name(device, dtype, shape)
        name = "sdpa" if key_lens and name == "flashinfer" else name
    if key_lens and name == "flashinfer":
        raise ValueError("attention_backend=flashinfer cannot mask ColBERT's query expansion tokens "
                         "(attend_to_expansion_tokens false); use sdpa, masked or varlen")
    if name == "sdpa":
        return SdpaBackend(causal=shape.causal)
    if name == "masked":
        return MaskedSdpaBackend(causal=shape.causal)
    if not _flash_shape_ok(device, dtype, shape):
        raise ValueError(f"attention_backend={name} needs CUDA, float16/bfloat16 and head_dim a multiple "
                         f"of 8 up to 256; got device {device.type}, {dtype}, head_dim {shape.head_dim}")
    if name == "varlen":
        if not varlen_available(device):
            raise ValueError("attention_backend=varlen: this torch has no FlashAttention "
                             "torch.nn.attention.varlen.varlen_attn for this GPU")
        return VarlenBackend(causal=shape.causal)
    if not flashinfer_available():
        raise ValueError("attention_backend=flashinfer: the flashinfer-python package is not installed")
    from engine_lib.attention.flashinfer import FlashInferBackend

    return FlashInferBackend(shape, dtype, device)

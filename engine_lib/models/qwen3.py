"""Qwen3 embedding model (Qwen3-Embedding and LLM-derived embedders) over packed ragged tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_lib.models.fused import FusedLinear, GatedLinear
from engine_lib.models.loader import CheckpointEmbedding


def rope_theta(cfg: dict) -> float:
    """transformers >= 5 nests it in `rope_parameters`; older configs keep it at the top level."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise ValueError(f"config.json: rope_type {params.get('rope_type')!r} is not supported (only default RoPE)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


class Qwen3RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused op (fp32 statistics inside); the reference scales after rounding to the
        # compute dtype, this scales before: identical in fp32, within rounding in bf16/fp16.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Qwen3RotaryEmbedding(nn.Module):
    """RoPE with a precomputed fp32 cos/sin table indexed by position (no host work per step)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        self.head_dim, self.max_positions, self.theta = head_dim, max_positions, theta
        self.register_buffer("cos_sin", torch.empty(max_positions, head_dim), persistent=False)

    def init_buffers(self) -> None:
        """Fill the table in fp32 on the module's device (after loading and any dtype cast)."""
        device = self.cos_sin.device
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float, device=device) / self.head_dim
        inv_freq = 1.0 / (self.theta ** exponents)
        freqs = torch.arange(self.max_positions, dtype=torch.float, device=device)[:, None] * inv_freq[None, :]
        self.cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [max_positions, head_dim] fp32

    def cos_sin_for(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [num_tokens, 1, head_dim/2]: computed once per forward, shared by every layer."""
        cos, sin = self.cos_sin[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Qwen3Attention(nn.Module):
    """Grouped-query attention with per-head RMSNorm on q and k before RoPE."""

    def __init__(self, cfg: dict, backend):
        super().__init__()
        hidden, bias = cfg["hidden_size"], cfg.get("attention_bias", False)
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads", self.num_heads)
        self.head_dim = cfg.get("head_dim") or hidden // self.num_heads
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = FusedLinear(hidden, (q_size, kv_size, kv_size), bias=bias)  # checkpoint q/k/v_proj
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.k_norm = Qwen3RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        self.backend = backend

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.qkv_proj.parts, dim=-1)
        q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = Qwen3RotaryEmbedding.rotate(q, *rope), Qwen3RotaryEmbedding.rotate(k, *rope)
        # K/V keep num_kv_heads: every backend takes grouped-query attention without a repeat.
        context = self.backend.forward(q, k, v, plan)  # [num_tokens, num_heads, head_dim]
        return self.o_proj(context.reshape(num_tokens, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: dict):
        super().__init__()
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        inter = cfg["intermediate_size"]
        self.gate_up_proj = GatedLinear(cfg["hidden_size"], inter)  # checkpoint gate/up_proj; silu(gate) * up
        self.down_proj = nn.Linear(inter, cfg["hidden_size"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


class Qwen3Layer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: dict, backend):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Qwen3Attention(cfg, backend)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = Qwen3MLP(cfg)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, plan)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Qwen3Model(nn.Module):
    """Embeddings -> decoder layers -> final RMSNorm (pooled by the last token, EOS, by default).

    Attention is causal, as the model was trained; `"is_causal": false` in config.json
    selects bidirectional attention for embedders trained that way.
    """

    checkpoint_prefixes = ("model.",)
    checkpoint_fusions = (
        (".self_attn.q_proj.", ".self_attn.qkv_proj.", 0),
        (".self_attn.k_proj.", ".self_attn.qkv_proj.", 1),
        (".self_attn.v_proj.", ".self_attn.qkv_proj.", 2),
        (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
        (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
    )
    checkpoint_renames = ()
    ignored_keys = ("lm_head.", "score.")

    @staticmethod
    def is_causal(cfg: dict) -> bool:
        return bool(cfg.get("is_causal", True))

    def __init__(self, cfg: dict, backend):
        super().__init__()
        if cfg.get("use_sliding_window"):
            raise ValueError("config.json: use_sliding_window=true is not supported for embedding")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.max_positions = cfg["max_position_embeddings"]
        self.embed_tokens = CheckpointEmbedding(cfg["vocab_size"], cfg["hidden_size"])
        self.rotary = Qwen3RotaryEmbedding(head_dim, self.max_positions, rope_theta(cfg))
        self.layers = nn.ModuleList(Qwen3Layer(cfg, backend) for _ in range(cfg["num_hidden_layers"]))
        self.norm = Qwen3RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def init_buffers(self) -> None:
        self.rotary.init_buffers()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # token_types: Qwen3 has no segments  # [num_tokens, hidden]
        rope = self.rotary.cos_sin_for(positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, rope, plan)
        return self.norm(hidden)  # [num_tokens, hidden]

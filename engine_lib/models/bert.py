"""BERT encoder over packed ragged tokens (no batch dimension, no padding)."""
from __future__ import annotations

import torch
from torch import nn

from engine_lib.models.fused import FusedLinear, LinearAct, ResidualLinear
from engine_lib.models.loader import CheckpointEmbedding


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: dict, position_offset: int = 0):
        super().__init__()
        self.word_embeddings = CheckpointEmbedding(cfg["vocab_size"], cfg["hidden_size"])
        self.position_embeddings = CheckpointEmbedding(cfg["max_position_embeddings"], cfg["hidden_size"])
        self.token_type_embeddings = CheckpointEmbedding(cfg.get("type_vocab_size", 2), cfg["hidden_size"])
        self.LayerNorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])
        self.position_offset = position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
        if token_types is None:
            hidden = hidden + self.token_type_embeddings.weight[0]  # single-segment input
        else:
            hidden = hidden + self.token_type_embeddings(token_types)  # pairs: 0 for the query, 1 for the document
        return self.LayerNorm(hidden)  # [num_tokens, hidden]


class BertAttention(nn.Module):
    def __init__(self, cfg: dict, backend):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.qkv = FusedLinear(hidden, (hidden, hidden, hidden))  # checkpoint query/key/value
        self.dense = ResidualLinear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=cfg["layer_norm_eps"])
        self.backend = backend

    def forward(self, hidden: torch.Tensor, plan) -> torch.Tensor:
        q, k, v = self.qkv(hidden).view(hidden.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        context = self.backend.forward(q, k, v, plan).reshape(hidden.shape)
        return self.LayerNorm(self.dense(context, hidden))  # residual add in the packed GEMM's epilogue


class BertMLP(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.intermediate = LinearAct(cfg["hidden_size"], cfg["intermediate_size"], cfg.get("hidden_act", "gelu"))
        self.output = ResidualLinear(cfg["intermediate_size"], cfg["hidden_size"])
        self.LayerNorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.output(self.intermediate(hidden), hidden))


class BertLayer(nn.Module):
    def __init__(self, cfg: dict, backend):
        super().__init__()
        self.attention = BertAttention(cfg, backend)
        self.mlp = BertMLP(cfg)

    def forward(self, hidden: torch.Tensor, plan) -> torch.Tensor:
        return self.mlp(self.attention(hidden, plan))


class BertModel(nn.Module):
    position_offset = 0
    # checkpoint key fragment -> (our fused module path fragment, part index)
    checkpoint_fusions = (
        (".attention.self.query.", ".attention.qkv.", 0),
        (".attention.self.key.", ".attention.qkv.", 1),
        (".attention.self.value.", ".attention.qkv.", 2),
    )
    # checkpoint key fragment -> our module path fragment
    checkpoint_renames = (
        (".attention.output.dense.", ".attention.dense."),
        (".attention.output.LayerNorm.", ".attention.LayerNorm."),
        (".intermediate.dense.", ".mlp.intermediate."),
        (".output.dense.", ".mlp.output."),
        (".output.LayerNorm.", ".mlp.LayerNorm."),
    )
    checkpoint_prefixes = ("bert.", "roberta.", "model.")
    # Heads (pooler, classifier, LM) are loaded by engine_lib.models.heads, not here.
    ignored_keys = ("pooler.", "embeddings.position_ids", "lm_head.", "cls.", "classifier.")

    @staticmethod
    def is_causal(cfg: dict) -> bool:
        return False

    def __init__(self, cfg: dict, backend):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg, self.position_offset)
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(BertLayer(cfg, backend) for _ in range(cfg["num_hidden_layers"]))})
        self.max_positions = cfg["max_position_embeddings"] - self.position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embeddings(input_ids, positions, token_types)
        for layer in self.encoder["layer"]:
            hidden = layer(hidden, plan)
        return hidden  # [num_tokens, hidden]


class XLMRobertaModel(BertModel):
    """XLM-RoBERTa: BERT layers, positions start after padding_idx + 1 (= 2)."""

    position_offset = 2

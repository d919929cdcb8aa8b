"""Sequence pooling over packed tokens, configured by the model folder.

torch is imported inside `pool` only, so the tokenizer process can read the
pooling mode (it appends EOS for last-token pooling) without loading torch.
"""
from __future__ import annotations

import json
import os

import numpy as np

POOLING_MODES = ("mean", "cls", "lasttoken")
FAMILY_POOLING = {"qwen3": "lasttoken"}  # model_type -> default when the folder says nothing


def default_pooling(model_type: str | None) -> str:
    return FAMILY_POOLING.get(model_type, "mean")


def read_pooling_mode(model_dir: str, default: str) -> str:
    """Pooling from sentence-transformers' modules.json / Pooling config."""
    modules_path = os.path.join(model_dir, "modules.json")
    pooling_dir = os.path.join(model_dir, "1_Pooling")
    if os.path.isfile(modules_path):
        with open(modules_path) as f:
            for module in json.load(f):
                if module.get("type", "").endswith("Pooling"):
                    pooling_dir = os.path.join(model_dir, module.get("path", ""))
    config_path = os.path.join(pooling_dir, "config.json")
    if not os.path.isfile(config_path):
        return default
    with open(config_path) as f:
        cfg = json.load(f)
    for mode, key in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                      ("lasttoken", "pooling_mode_lasttoken")):
        if cfg.get(key):
            return mode
    raise ValueError(f"{config_path}: no supported pooling mode set (supported: {POOLING_MODES})")


def pool(hidden, cu_seqlens, seq_ids, mode: str):
    """hidden [num_tokens, H] -> [num_seqs, H]; seq_ids [num_tokens] maps token -> sequence.

    Graph padding: tokens past cu_seqlens[-1] carry seq_id == num_seqs (a scratch
    row that is dropped); zero-length dummy sequences give rows nobody reads (indices
    are clamped so they stay in bounds).
    """
    import torch

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


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)

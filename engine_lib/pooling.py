"""Sequence pooling over packed tokens, configured by the model folder."""
from __future__ import annotations

import json
import os

import numpy as np
import torch

POOLING_MODES = ("mean", "cls", "lasttoken")


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


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, seq_ids: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [num_tokens, H] -> [num_seqs, H]; seq_ids [num_tokens] maps token -> sequence."""
    num_seqs = cu_seqlens.shape[0] - 1
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long()]
    if mode == "lasttoken":
        return hidden[cu_seqlens[1:].long() - 1]
    if mode == "mean":
        sums = torch.zeros(num_seqs, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seq_ids, hidden.float())
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.float32).unsqueeze(1)
        return sums / lens
    raise ValueError(f"unknown pooling mode {mode!r}")


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)

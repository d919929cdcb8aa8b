"""Engine: one loaded model on one device; `step(PackedBatch) -> LazyTensor`."""
from __future__ import annotations

import numpy as np
import torch

from .attention import select_backend
from .batch import PackedBatch
from .lazy_tensor import CudaLazyTensor, LazyTensor, ResolvedTensor
from .loader import load_weights
from .models import model_class, read_model_config
from .pooling import pool, read_pooling_mode

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


class Engine:
    def __init__(self, model_dir: str, device: str = "auto", dtype: str = "auto",
                 attention_backend: str = "auto"):
        self.model_dir = model_dir
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        cfg = read_model_config(model_dir)
        cls = model_class(cfg)
        self.backend = select_backend(attention_backend, self.device, cls.causal)
        self.pooling = read_pooling_mode(model_dir, default=getattr(cls, "default_pooling", "mean"))
        self.vocab_size = cfg["vocab_size"]
        with torch.device("meta"):
            model = cls(cfg, self.backend)
        model = model.to_empty(device="cpu")
        load_weights(model, model_dir)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.max_positions = self.model.max_positions
        self.hidden_size = cfg["hidden_size"]
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass; returns pooled fp32 [num_seqs, hidden] (not normalised)."""
        to_device = lambda a: torch.from_numpy(a).to(self.device, non_blocking=True)
        input_ids, positions = to_device(batch.input_ids), to_device(batch.positions)
        cu_seqlens = to_device(batch.cu_seqlens)
        seq_ids = to_device(np.repeat(np.arange(batch.num_seqs), batch.seq_lens))
        plan = self.backend.plan(batch.cu_seqlens, batch.max_seqlen, self.device)
        hidden = self.model(input_ids, positions, plan)
        pooled = pool(hidden, cu_seqlens, seq_ids, self.pooling).float()
        if self.device.type == "cuda":
            return CudaLazyTensor(pooled, self._copy_stream)
        return ResolvedTensor(pooled.numpy())

"""A compiled CPU forward (the `cpu_compile` setting): inductor over the model's layers, cached on disk.

`compile_layers` wraps the model (embeddings and layer stack, not the head) in
`torch.compile`. Attention runs outside the graph (its plan's shapes and group
count change per batch): each layer's attention call is a graph break, and the
pieces between (GEMMs, GELU, residual adds with their LayerNorms) are inductor
code. At load two batches of different token counts compile it: the second
makes every piece's token count symbolic (automatic dynamic shapes; only the
token dimension changed), so it serves every batch with static hidden sizes.
Inductor's FX graph cache under `cache_dir` makes later starts load the
kernels instead of building them. After load, a batch whose guards fail
(e.g. one token: 0/1 specialisation) runs eagerly rather than recompiling
while serving. Packed oneDNN Linears (models/cpu_linear.py) are refused: the
layers must be plain. Off by default: no gain measured (docs/engine.md).
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import torch

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
MIN_COSINE = 0.9999  # every probe token's hidden state, compiled vs plain, both float32 on this CPU


class _OutsideGraph:
    """An attention backend whose `forward` is a graph break (its plan varies per batch)."""

    def __init__(self, backend):
        self._backend = backend
        self.forward = torch.compiler.disable(backend.forward)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


def wanted(mode: str, device: torch.device) -> bool:
    if mode not in MODES:
        raise ValueError(f"cpu_compile must be one of {MODES}, got {mode!r}")
    if mode == "on" and device.type != "cpu":
        raise ValueError(f"cpu_compile=on is for CPU engines; this one is on {device.type}")
    return mode != "off" and device.type == "cpu"


def compile_layers(model: torch.nn.Module, backend, cache_dir: str) -> Callable:
    """`model`'s forward compiled with symbolic token counts (compiles on its first call).
    `cache_dir` ("" = inductor's default) holds inductor's on-disk caches."""
    from engine_lib.models.cpu_linear import PACKED_TYPES

    if any(isinstance(m, PACKED_TYPES) for m in model.modules()):
        # inductor lowers _linear_pointwise only for weights it packed itself (freezing), not for ours
        raise ValueError("the layers have packed oneDNN Linears (cpu_linear), which inductor cannot take as inputs")
    if cache_dir:
        # Inductor reads its cache location from the environment when it first compiles.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    eager = _OutsideGraph(backend)
    for module in model.modules():
        if getattr(module, "backend", None) is backend:
            module.backend = eager
    compiled = torch.compile(model)

    def forward(*args):
        # Never recompile while serving: a batch the compiled code's guards reject runs eagerly.
        with torch.compiler.set_stance("eager_on_recompile"):
            return compiled(*args)

    forward.compile_first = compiled  # the load-time call that compiles
    return forward

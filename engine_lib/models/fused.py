"""Projections with more to them than one nn.Linear: fused parts, a fused activation.

A `FusedLinear` holds the concatenation (along the output dimension) of the
checkpoint's separate projections, e.g. q/k/v or gate/up. Checkpoints keep
their layout: the loader copies each part into its rows (`part_rows`).
`LinearAct` is a Linear followed by its activation, `ResidualLinear` one whose
output is added to a residual, and `GatedLinear` Qwen3's silu(gate) * up, so the
packed CPU path (models/cpu_linear.py) can run the activation or the residual add
in the GEMM's epilogue; parameter names stay the checkpoint's.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

# config.json hidden_act -> function (each also has an epilogue in models/cpu_linear.py)
ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "silu": F.silu, "tanh": F.tanh}


class FusedLinear(nn.Linear):
    def __init__(self, in_features: int, parts: tuple[int, ...], bias: bool = True):
        super().__init__(in_features, sum(parts), bias=bias)
        self.parts = tuple(parts)

    def part_rows(self, index: int) -> tuple[int, int]:
        """(start, length) of part `index` along dim 0 of weight and bias."""
        return sum(self.parts[:index]), self.parts[index]


class LinearAct(nn.Linear):
    """activation(x W^T + b), `activation` a key of ACTIVATIONS."""

    def __init__(self, in_features: int, out_features: int, activation: str, bias: bool = True):
        if activation not in ACTIVATIONS:
            raise ValueError(f"config.json: hidden_act {activation!r} is not supported; supported: "
                             f"{sorted(ACTIVATIONS)}")
        super().__init__(in_features, out_features, bias=bias)
        self.activation = activation

    def forward(self, x):
        return ACTIVATIONS[self.activation](super().forward(x))


class ResidualLinear(nn.Linear):
    """x W^T + b + residual (BERT's attention-output and MLP-output projections)."""

    def forward(self, x, residual):
        return super().forward(x) + residual


class GatedLinear(FusedLinear):
    """SwiGLU's first half: silu(x W_gate^T) * (x W_up^T), gate and up one GEMM (parts 0 and 1)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, (out_features, out_features), bias=bias)

    def forward(self, x):
        gate, up = super().forward(x).chunk(2, dim=-1)
        return F.silu(gate) * up

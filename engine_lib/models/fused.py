"""Fused projections: several checkpoint Linears stored as one GEMM.

A `FusedLinear` holds the concatenation (along the output dimension) of the
checkpoint's separate projections, e.g. q/k/v or gate/up. Checkpoints keep
their layout: the loader copies each part into its rows (`part_rows`).
"""
from __future__ import annotations

from torch import nn


class FusedLinear(nn.Linear):
    def __init__(self, in_features: int, parts: tuple[int, ...], bias: bool = True):
        super().__init__(in_features, sum(parts), bias=bias)
        self.parts = tuple(parts)

    def part_rows(self, index: int) -> tuple[int, int]:
        """(start, length) of part `index` along dim 0 of weight and bias."""
        return sum(self.parts[:index]), self.parts[index]

"""CPU linear layers on oneDNN with weights packed once at load (the `cpu_linear` setting).

On CPU `F.linear` goes to MKL's GEMM, which on AMD EPYC runs the models' own
shapes well below oneDNN with the weight reordered once into oneDNN's blocked
layout (figures in docs/engine.md). `pack_linears` swaps every Linear of a model
for a packed one calling `torch.ops.mkldnn._linear_pointwise`, what inductor's
CPU freezing emits, with ReLU and residual adds in the GEMM's epilogue (the
transcendental activations follow the GEMM: `EPILOGUES`). These are private torch entry points that change between
releases: `probe` runs each packed layer kind once on tiny tensors against the
plain one; if an op is missing or wrong, the plain path serves, with one log line.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from engine_lib.models.fused import ACTIVATIONS, FusedLinear, GatedLinear, LinearAct, ResidualLinear
from engine_lib.models.loader import allocate

log = logging.getLogger(__name__)

MODES = ("auto", "onednn", "plain")

# LinearAct.activation -> (oneDNN post-op, algorithm) of _linear_pointwise. Only ReLU runs in the epilogue:
# oneDNN's erf/tanh GELU, swish and tanh post-ops took 15-30% longer than the same GEMM followed by torch's
# own activation (2-core AVX2 EPYC, docs/engine.md), so every other activation follows the GEMM.
EPILOGUES = {None: ("none", ""), "relu": ("relu", "")}


def onednn_ops() -> SimpleNamespace:
    """The private ops (AttributeError or RuntimeError where this torch lacks them)."""
    ops = torch.ops.mkldnn
    return SimpleNamespace(reorder=ops._reorder_linear_weight, linear=ops._linear_pointwise.default,
                           linear_binary=ops._linear_pointwise.binary)


class _RowDispatch(nn.Module):
    """A packed layer that keeps its plain layer (`plain`) for inputs of more than `plain_above_rows`
    rows, where MKL's GEMM beats oneDNN's on the packed weight; None: packed for every input."""

    def __init__(self, linear: nn.Linear, plain_above_rows: int | None):
        super().__init__()
        self.ops = onednn_ops()
        self.plain = None if plain_above_rows is None else linear
        self.plain_above_rows = plain_above_rows

    def runs_plain(self, x: torch.Tensor) -> bool:
        return self.plain is not None and x.shape[0] > self.plain_above_rows


class PackedLinear(_RowDispatch):
    """A Linear, FusedLinear or LinearAct with its weight in oneDNN's layout; called the same way."""

    def __init__(self, linear: nn.Linear, plain_above_rows: int | None = None):
        super().__init__(linear, plain_above_rows)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if isinstance(linear, FusedLinear):
            self.parts = linear.parts
        activation = getattr(linear, "activation", None)
        self.post_op, self.algorithm = EPILOGUES.get(activation, ("none", ""))
        self.activation_after = None if activation in EPILOGUES else ACTIVATIONS[activation]
        self.packed_weight = self.ops.reorder(linear.weight.detach(), None)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runs_plain(x):
            return self.plain(x)
        out = self.ops.linear(x, self.packed_weight, self.bias, self.post_op, [], self.algorithm)
        return out if self.activation_after is None else self.activation_after(out)


class PackedResidualLinear(PackedLinear):
    """ResidualLinear with `+ residual` in the GEMM's epilogue (the `binary` `add` form)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.runs_plain(x):
            return self.plain(x, residual)
        return self.ops.linear_binary(x, residual, self.packed_weight, self.bias, "add")


class PackedGatedLinear(_RowDispatch):
    """GatedLinear as two packed GEMMs: silu after the gate's (EPILOGUES), `* gate` in the up GEMM's epilogue."""

    def __init__(self, linear: GatedLinear, plain_above_rows: int | None = None):
        super().__init__(linear, plain_above_rows)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, bias = linear.weight.detach(), linear.bias
        (gate_start, size), (up_start, _) = linear.part_rows(0), linear.part_rows(1)
        self.gate_weight = self.ops.reorder(weight.narrow(0, gate_start, size).contiguous(), None)
        self.up_weight = self.ops.reorder(weight.narrow(0, up_start, size).contiguous(), None)
        self.gate_bias = None if bias is None else nn.Parameter(bias.detach()[gate_start:gate_start + size].clone())
        self.up_bias = None if bias is None else nn.Parameter(bias.detach()[up_start:up_start + size].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runs_plain(x):
            return self.plain(x)
        gate = F.silu(self.ops.linear(x, self.gate_weight, self.gate_bias, "none", [], ""), inplace=True)
        return self.ops.linear_binary(x, gate, self.up_weight, self.up_bias, "mul")


PACKED = {nn.Linear: PackedLinear, FusedLinear: PackedLinear, LinearAct: PackedLinear,
          ResidualLinear: PackedResidualLinear, GatedLinear: PackedGatedLinear}
PACKED_TYPES = (PackedLinear, PackedGatedLinear)


# cpu_linear=auto packs a layer only when its weight has at least this many elements: measured on a
# 2-core EPYC, all-MiniLM-L6-v2's steps of up to 128 tokens (384 x 384 and up) ran 1.0-1.2x faster packed,
# and a 32-wide model's step 0.15 ms slower (oneDNN's fixed cost per call); docs/engine.md.
AUTO_MIN_WEIGHT_ELEMENTS = 1 << 17
# ... and runs it packed for inputs of up to this many rows (tokens), on MKL's F.linear above: packed
# GEMMs gain up to 2x at 16 rows and lose 5-18% from 256 up (MiniLM's and Qwen3-0.6B's shapes), and
# all-MiniLM-L6-v2's steps ran 1.06x faster packed at 128 tokens, 1.00x at 256, 0.93x at 512-1024.
AUTO_PACKED_MAX_ROWS = 128


@torch.no_grad()
def pack_linears(module: nn.Module, min_weight_elements: int = 0, plain_above_rows: int | None = None) -> int:
    """Swap every Linear under `module` (exact types in PACKED) whose weight has at least
    `min_weight_elements` elements for its packed form; returns how many. `plain_above_rows`: the
    packed layer keeps the plain one (a second copy of its weight) and runs it for inputs of more
    rows; None drops the plain weights. Pack last, after loading, dtype and device."""
    count = 0
    for parent in list(module.modules()):
        if isinstance(parent, PACKED_TYPES):
            continue  # its kept plain layer
        for name, child in list(parent.named_children()):
            packed = PACKED.get(type(child))
            if packed is not None and child.weight.numel() >= min_weight_elements:
                setattr(parent, name, packed(child, plain_above_rows))
                count += 1
    return count


def _probe_layers(dtype: torch.dtype) -> list[nn.Module]:
    """One small layer of every kind `pack_linears` packs, with every epilogue (weights not set:
    built on the meta device, so torch's global random state is left alone)."""
    with torch.device("meta"):
        layers = [nn.Linear(16, 8), FusedLinear(16, (8, 4, 4)), nn.Linear(16, 8, bias=False), GatedLinear(16, 8),
                  ResidualLinear(16, 8)]
        layers += [LinearAct(16, 8, activation) for activation in ACTIVATIONS]
    return [allocate(layer).to(dtype) for layer in layers]


@torch.no_grad()
def probe(dtype: torch.dtype) -> str | None:
    """None when every packed layer kind gives the plain layer's rows here in `dtype`; else why not."""
    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN (torch.backends.mkldnn)"
    generator = torch.Generator().manual_seed(0)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    try:
        for layer in _probe_layers(dtype):
            for param in layer.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) / 4)
            x = torch.randn(5, 16, generator=generator).to(dtype)
            extra = (torch.randn(5, 8, generator=generator).to(dtype),) if isinstance(layer, ResidualLinear) else ()
            expected = layer(x, *extra).float()
            got = PACKED[type(layer)](layer)(x, *extra).float()
            if got.shape != expected.shape or not torch.allclose(got, expected, atol=tolerance, rtol=tolerance):
                return f"{type(layer).__name__} {getattr(layer, 'activation', '')} gives other rows than F.linear"
    except (AttributeError, RuntimeError, TypeError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def use_onednn(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to pack: `plain` never; `auto` on CPU when the probe passes (else the plain path and one
    log line); `onednn` insists (an error naming why it cannot)."""
    if mode not in MODES:
        raise ValueError(f"cpu_linear must be one of {MODES}, got {mode!r}")
    if mode == "plain" or (mode == "auto" and device.type != "cpu"):
        return False
    reason = f"device is {device.type}, not cpu" if device.type != "cpu" else probe(dtype)
    if reason is None:
        return True
    if mode == "onednn":
        raise ValueError(f"cpu_linear=onednn: the packed oneDNN path does not work here ({reason})")
    log.warning("cpu_linear=auto: linear layers run on F.linear, not packed oneDNN (%s, %s)",
                str(dtype).removeprefix("torch."), reason)
    return False

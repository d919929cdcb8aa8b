"""What `dtype=auto` serves on a CPU: bfloat16 where the CPU has bf16 dot-product instructions.

With AVX512-BF16 or AMX (`lscpu` lists `avx512_bf16` or `amx_bf16`) oneDNN runs bf16 GEMMs at
two or more times the float32 rate; elsewhere bf16 is emulated and slower than float32, so
`auto` serves float32 there. A model too small to gain (`bf16_pays`) stays float32 too. ROSE_CPU_BF16=off makes `auto` serve float32 on every CPU (a fleet
of mixed CPUs that must give the same rows on every replica); `auto`, the default, decides by
the CPU. An explicit `dtype` is never changed.
"""
from __future__ import annotations

import os
import platform
from typing import Iterable, Mapping, Optional

CPU_BF16_ENV = "ROSE_CPU_BF16"
CPU_BF16_MODES = ("auto", "off")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's flags (x86 Linux); empty where there is no such file or line."""
    try:
        with open(cpuinfo) as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def native_bf16(flags: Optional[Iterable[str]] = None) -> bool:
    if flags is None:
        flags = cpu_flags() if platform.machine() in ("x86_64", "AMD64") else ()
    return any(f in BF16_FLAGS for f in flags)


# Measured on a 2-core Xeon with AMX, one sequence of 128 tokens in-process: a 128-wide model (largest
# weight 128 x 512) stepped 1.2x slower in bfloat16 (conversions cost more than its GEMMs), all-MiniLM
# (384 x 1536) 1.7x faster; docs/engine.md, "dtype on a CPU".
MIN_BF16_WEIGHT_ELEMENTS = 1 << 18


def bf16_pays(config: Mapping) -> bool:
    """Whether a model's largest layer (hidden_size x intermediate_size) is large enough to gain from bf16."""
    hidden = int(config.get("hidden_size", 0) or 0)
    return hidden * int(config.get("intermediate_size", 4 * hidden) or 4 * hidden) >= MIN_BF16_WEIGHT_ELEMENTS


def auto_cpu_bf16(environ: Optional[Mapping[str, str]] = None, flags: Optional[Iterable[str]] = None) -> bool:
    """Whether `dtype=auto` serves bfloat16 on this CPU (ROSE_CPU_BF16, then the CPU's flags)."""
    mode = (os.environ if environ is None else environ).get(CPU_BF16_ENV, "auto").strip().lower() or "auto"
    if mode not in CPU_BF16_MODES:
        raise ValueError(f"{CPU_BF16_ENV}={mode!r}: expected one of {', '.join(CPU_BF16_MODES)}")
    return mode == "auto" and native_bf16(flags)

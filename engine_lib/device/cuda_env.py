"""Does this torch's CUDA fit this machine's NVIDIA driver? A load-time error naming both when not.

The PyPI torch wheel brings its own CUDA runtime (torch 2.13: CUDA 13.0);
a driver runs a runtime only up to the CUDA version it supports, so a node
whose driver is older fails at the first CUDA call. Without this check,
`device=auto` would quietly fall back to the CPU on such a GPU node.
docs/deploy.md states the driver the image needs.
"""
from __future__ import annotations

import ctypes
import re

# Minimum Linux driver per CUDA major version (CUDA's release notes; minor-version compatibility).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
PROC_VERSION = "/proc/driver/nvidia/version"


def driver_cuda_version() -> int | None:
    """The newest CUDA the installed driver supports (e.g. 13000 for 13.0), or None without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def driver_version() -> str | None:
    """The kernel module's version string (e.g. 580.159.03), or None."""
    try:
        with open(PROC_VERSION) as f:
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def _cuda_str(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def cuda_mismatch(torch_version: str, torch_cuda: str | None, driver_cuda: int | None,
                  driver: str | None, cuda_available: bool) -> str | None:
    """Why this torch cannot use this machine's GPU (naming driver and CUDA versions), or None if it can or no GPU."""
    if torch_cuda is None or (driver_cuda is None and driver is None):
        return None  # a CPU build of torch, or no NVIDIA driver: nothing to fit
    major = int(torch_cuda.split(".")[0])
    need = f"an NVIDIA driver >= {MIN_DRIVER.get(major, '?')} (CUDA {major}.x)"
    have = f"this machine's driver {driver or 'of unknown version'}"
    if driver_cuda is not None:
        have += f" supports CUDA up to {_cuda_str(driver_cuda)}"
    if driver_cuda is not None and driver_cuda // 1000 < major:
        return f"torch {torch_version} is built for CUDA {torch_cuda} and needs {need}; {have}"
    if not cuda_available:
        return (f"torch {torch_version} (CUDA {torch_cuda}) sees no usable GPU although an NVIDIA driver is "
                f"installed ({have}; torch needs {need}); check the container's GPU access")
    return None


def check_cuda_fits() -> None:
    """Raise RuntimeError naming driver and CUDA versions when this torch cannot use the machine's GPU."""
    import torch

    reason = cuda_mismatch(torch.__version__, torch.version.cuda, driver_cuda_version(), driver_version(),
                           torch.cuda.is_available())
    if reason:
        raise RuntimeError(reason)

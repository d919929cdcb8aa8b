"""What the numbers were measured on: CPU/GPU, cores, memory, packages; and its GEMM FLOP/s."""
from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
import time

PACKAGES = ["torch", "transformers", "sentence-transformers", "tokenizers", "tritonclient", "nvidia-pytriton", "numpy"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kib = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
        return round(kib / 2**20, 1)
    except (OSError, AttributeError):
        return None


def versions(names=PACKAGES) -> dict:
    out = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def describe() -> dict:
    flags = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "")
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags]
    # GIT_COMMIT first: a device machine may have no git, or a copy of the tree newer than its git metadata.
    commit = os.environ.get("GIT_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(__file__)).stdout.strip()
        except OSError:
            pass
    return {
        "cpu": cpu_model(), "cpu_isa": isa, "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)), "memory_gib": _mem_gib(), "gpu": gpu_model(),
        "os": platform.platform(), "python": platform.python_version(), "packages": versions(),
        "load_avg_at_start": os.getloadavg(), "git_commit": commit,
        "date": datetime.date.today().isoformat(),
    }


def vector_isa(machine: dict) -> str:  # "AVX-512", "AVX2" or "": CPU hosts of one name differ by it
    return next((n for f, n in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if f in machine.get("cpu_isa", ())), "")


def slug(machine: dict) -> str:
    """The machine kind's results folder name, e.g. amd-epyc-2c or amd-epyc-avx512-2c (one file per profile)."""
    name = machine["gpu"].split(",")[0] if machine.get("gpu") else machine["cpu"]
    name = re.sub(r"\((r|tm)\)|cpu|processor|@.*", "", name, flags=re.I)
    name = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32]
    cpu_kind = "-avx512" if not machine.get("gpu") and vector_isa(machine) == "AVX-512" else ""
    return f"{name}{cpu_kind}-{machine['cores']}c"


def machine_line(m: dict) -> str:
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU"
    return (f"{m['cpu']} ({m['cores']} cores, {'/'.join(m.get('cpu_isa', []))}){gpu}, {m.get('memory_gib')} GiB, "
            f"{m.get('os')}, Python {m.get('python')}; load average at start {m['load_avg_at_start'][0]:.2f}"
            + (f", at end {m['load_avg_at_end'][0]:.2f}" if m.get("load_avg_at_end") else ""))


def gemm_flops(seconds: float = 3.0) -> dict:
    """Best dense-GEMM rate torch reaches here (fp32 on CPU, bf16 on GPU): the machine's ceiling."""
    import torch  # optional heavy dependency: peer venvs import this module without torch

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    best = {"flops_per_s": 0.0}
    for n in ((4096, 8192) if cuda else (512, 1024, 2048)):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        torch.matmul(a, b)
        reps, deadline = 0, time.perf_counter() + seconds / 3
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        while time.perf_counter() < deadline or reps < 3:
            torch.matmul(a, b)
            reps += 1
            if cuda:
                torch.cuda.synchronize()
        rate = 2 * n**3 * reps / (time.perf_counter() - start)
        if rate > best["flops_per_s"]:
            best = {"flops_per_s": rate, "n": n, "dtype": str(dtype).replace("torch.", ""), "device": device,
                    "threads": torch.get_num_threads()}
    return best


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of all cores busy over `interval` seconds (anyone's work, ours included)."""
    busy0, total0 = _cpu_times()
    time.sleep(interval)
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_until_quiet(threshold: float, max_wait: float) -> float:
    """Wait (at most `max_wait` s) until the machine is under `threshold` busy; returns the last reading."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy(2.0)
    return busy

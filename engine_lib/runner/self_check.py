"""Load-time self-check: the served dtype must agree with fp32 on a built-in probe set.

The probe sequences are fixed (seeded) token ids of a few lengths. The served
model embeds them in its dtype; a float32 copy of the same weights embeds
them on the same device; if any row's cosine is below MIN_COSINE (the 0.1%
rule) the engine refuses to load, naming the figure. A float32 engine has
nothing to compare and reports 1.0 without a second model.
"""
from __future__ import annotations

import logging

import numpy as np

from engine_lib.contract import PackedBatch

log = logging.getLogger(__name__)

MIN_COSINE = 0.999  # the one agreement bar (the seed's 0.1%): self-check, perf warm-up checks and tests
PROBE_LENGTHS = (1, 5, 16, 61, 200)
PROBE_SEED = 20261130


class SelfCheckError(RuntimeError):
    """The served dtype disagrees with fp32 beyond the tolerance: the model must not be served."""


def probe_batch(vocab_size: int, max_positions: int) -> PackedBatch:
    rng = np.random.default_rng(PROBE_SEED)
    low = min(100, vocab_size // 2)  # skip the lowest ids (special tokens in most vocabularies)
    lengths = sorted({min(n, max_positions) for n in PROBE_LENGTHS})
    return PackedBatch.from_sequences([rng.integers(low, vocab_size, size=n) for n in lengths])


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)


def check(served: np.ndarray, reference: np.ndarray, dtype_name: str, device: str) -> float:
    """Minimum cosine of served vs reference rows; raises SelfCheckError below MIN_COSINE (NaN included)."""
    cosines = row_cosines(served, reference)
    worst = float(np.nan_to_num(cosines, nan=-1.0).min())
    if not worst >= MIN_COSINE:
        row = int(np.nan_to_num(cosines, nan=-1.0).argmin())
        raise SelfCheckError(
            f"self-check failed: {dtype_name} on {device} vs float32 on the same device gives cosine "
            f"{worst:.6f} (< {MIN_COSINE}) on probe sequence {row}; refusing to load. Serve this model "
            f"in another dtype (dtype=float32 or bfloat16) or check the weights")
    log.info("self-check: %s vs float32 on %s, minimum cosine %.6f over %d probe sequences",
             dtype_name, device, worst, len(cosines))
    return worst

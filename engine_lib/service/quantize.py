"""Compact output types of float embedding rows, as sentence-transformers' `quantize_embeddings` makes them.

- int8 / uint8: per-dimension scalar quantization over `ranges` [2, D] (min row, max row):
  256 buckets of width (max - min) / 255 from min, clipped to [0, 255]; int8 is that minus 128.
  The arithmetic is float32, step for step as `quantize_embeddings(rows, "int8", ranges=...)`.
- binary / ubinary: one sign bit per dimension (value > 0), packed big-endian 8 per byte
  (`np.packbits`), [N, ceil(D/8)]; binary is that minus 128 as int8.
"""
from __future__ import annotations

import numpy as np


def quantize_scalar(rows: np.ndarray, ranges: np.ndarray, signed: bool) -> np.ndarray:
    """rows [N, D] float, ranges [2, D] -> int8 (signed) or uint8 [N, D]."""
    if ranges.shape != (2, rows.shape[1]):
        raise ValueError(f"ranges have shape {list(ranges.shape)}; rows have {rows.shape[1]} dimensions")
    ranges = ranges.astype(np.float32, copy=False)
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((rows - starts) / steps), 0, 255)
    return (buckets - 128).astype(np.int8) if signed else buckets.astype(np.uint8)


def pack_signs(rows: np.ndarray, signed: bool) -> np.ndarray:
    """rows [N, D] -> packed sign bits, int8 (signed: minus 128) or uint8 [N, ceil(D/8)]."""
    packed = np.packbits(rows > 0, axis=-1)
    return (packed.astype(np.int16) - 128).astype(np.int8) if signed else packed


def min_max(rows: np.ndarray) -> np.ndarray:
    """Per-dimension ranges [2, D] (float32) of calibration rows [N, D]."""
    return np.vstack((rows.min(axis=0), rows.max(axis=0))).astype(np.float32)

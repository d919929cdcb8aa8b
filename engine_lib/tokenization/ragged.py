"""Token id lists -> the ragged form every tokenizer path sends the encoder: flat ids + lengths."""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np


def flatten(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """-> (flat int64 ids, int64 lengths [len(rows)]): `rows` end to end, no padding."""
    seq_lens = np.array([len(r) for r in rows], dtype=np.int64)
    if len(rows) == 1:
        return np.array(rows[0], dtype=np.int64), seq_lens
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(seq_lens.sum())), seq_lens

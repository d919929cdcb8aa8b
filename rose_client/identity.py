"""Which model a replica serves, as the bulk tool records it: the served model's name, its
output width and a fingerprint (the start of the embedding of a fixed probe text, rounded),
so a resumed job or a list of replicas never mixes two models' vectors in one file."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PROBE_TEXT = "rose model identity probe: the quick brown fox jumps over the lazy dog"
FINGERPRINT_DIMS = 32   # leading components kept
FINGERPRINT_DECIMALS = 4
# Same model on another device or dtype (GPU bfloat16 vs CPU float32) agrees well above this;
# two different models' fingerprints are all but uncorrelated.
MIN_FINGERPRINT_COSINE = 0.99


class ModelMismatch(RuntimeError):
    """Two different models would write rows of one output: a job resumed against another
    model, or replicas that serve different models."""


@dataclass(frozen=True)
class ModelIdentity:
    name: str         # the Triton model the rows come from (e.g. ensemble)
    dimensions: int   # its output width, before any `dimensions` request parameter
    fingerprint: tuple[float, ...]

    @classmethod
    def from_probe(cls, name: str, row: np.ndarray) -> "ModelIdentity":
        """From the model's row for PROBE_TEXT ([D] float)."""
        row = np.asarray(row, dtype=np.float64).reshape(-1)
        head = row[:FINGERPRINT_DIMS] / (np.linalg.norm(row) or 1.0)
        return cls(name, int(row.shape[0]), tuple(round(float(v), FINGERPRINT_DECIMALS) for v in head))

    @classmethod
    def from_json(cls, record) -> "ModelIdentity | None":
        """From a journal header's record; None when it is not one (an older journal)."""
        try:
            return cls(str(record["name"]), int(record["dimensions"]), tuple(float(v) for v in record["fingerprint"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> dict:
        return {"name": self.name, "dimensions": self.dimensions, "fingerprint": list(self.fingerprint)}

    def matches(self, other: "ModelIdentity | None") -> bool:
        if other is None or (self.name, self.dimensions) != (other.name, other.dimensions):
            return False
        a, b = np.array(self.fingerprint), np.array(other.fingerprint)
        if a.shape != b.shape or not a.any() or not b.any():
            return a.shape == b.shape and np.array_equal(a, b)
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= MIN_FINGERPRINT_COSINE

    def __str__(self) -> str:
        return f"{self.name} ({self.dimensions} dimensions, fingerprint {list(self.fingerprint[:4])}...)"

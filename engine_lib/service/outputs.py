"""What the encoder answers per request: embedding rows or one score per document.

The service hands back raw engine rows per request; `finish` turns them into
the response tensor, `check` refuses options the model cannot honour.
"""
from __future__ import annotations

import numpy as np

from engine_lib.options import RequestOptions, RerankOptions
from rose_wire import EMBEDDINGS, SCORES


def normalize_rows(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def finish_rows(rows: np.ndarray, options: RequestOptions) -> np.ndarray:
    """Raw pooled rows [N, H] -> the answer: first `dimensions` columns, then normalised; fp32, contiguous."""
    if options.dimensions:
        rows = rows[:, :options.dimensions]
    if options.normalize:
        rows = normalize_rows(rows)
    return np.ascontiguousarray(rows, dtype=np.float32)


class EmbeddingOutput:
    """EMBEDDINGS FP32 [N, D]: Matryoshka cut (`dimensions`), then L2 normalisation (`normalize`)."""

    name = EMBEDDINGS
    options_type = RequestOptions

    def __init__(self, width: int):
        self.width = width

    def check(self, options: RequestOptions) -> None:
        options.check_width(self.width)

    def finish(self, rows: np.ndarray, options: RequestOptions) -> np.ndarray:
        return finish_rows(rows, options)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow warning for large |x|


class ScoreOutput:
    """SCORES FP32 [N]: the logit (`raw_scores`) or the model's activation of it."""

    name = SCORES
    options_type = RerankOptions
    ACTIVATIONS = {"sigmoid": sigmoid, "identity": lambda x: x}

    def __init__(self, activation: str):
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"unknown score activation {activation!r}")
        self.activation = activation

    def check(self, options: RerankOptions) -> None:
        pass

    def finish(self, rows: np.ndarray, options: RerankOptions) -> np.ndarray:
        logits = rows[:, 0].astype(np.float64)
        scores = logits if options.raw_scores else self.ACTIVATIONS[self.activation](logits)
        return np.ascontiguousarray(scores, dtype=np.float32)


def output_for(engine):
    """The answer an engine's task calls for."""
    if engine.task == "score":
        return ScoreOutput(engine.score_activation)
    return EmbeddingOutput(engine.output_dim)

"""Chunks of different jobs that wait for a slot may share one call (aio.py): their
calls' row inputs are concatenated, and the answer's rows go back by offset."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from .aio_stream import Call


@dataclass(frozen=True)
class Merge:
    """Jobs with equal `key` may share calls, up to `max_tokens` and `max_texts` per call
    (the chunks' `num_tokens` and `num_texts`). The key must cover everything a call
    carries besides its rows: model, request parameters, and the `shared` inputs (e.g. a
    rerank query), which are sent once; the other inputs are concatenated along axis 0."""
    key: Hashable
    max_tokens: int
    max_texts: int
    shared: frozenset[str] = frozenset()

    def combine(self, calls: Sequence[Call]) -> Call:
        first = calls[0]
        for call in calls[1:]:  # a key that missed something: refuse (aio.py then sends each alone)
            if (call.model, call.output, call.parameters, set(call.inputs)) != (
                    first.model, first.output, first.parameters, set(first.inputs)) or any(
                    not np.array_equal(call.inputs[name], first.inputs[name]) for name in self.shared):
                raise ValueError(f"calls of merge key {self.key!r} differ beyond their rows")
        inputs = {name: tensor if name in self.shared else np.concatenate([c.inputs[name] for c in calls])
                  for name, tensor in first.inputs.items()}
        rows = None if any(c.rows is None for c in calls) else sum(c.rows for c in calls)
        return Call(first.model, inputs, first.output, first.parameters, rows=rows)

    @staticmethod
    def split(result: Any, sizes: Sequence[int]) -> list[Any]:
        """The rows of each part, in order (views of `result`)."""
        if len(result) != sum(sizes):
            raise ValueError(f"{len(result)} rows came back for {sum(sizes)}")
        offsets = np.cumsum([0, *sizes])
        return [result[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def parameters_key(parameters: dict | None) -> tuple:
    """A hashable form of request parameters (types kept apart: 1 is not True)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in (parameters or {}).items()))

"""A tokenizer model's requests of one `execute`, tokenized as one group.

Triton's dynamic batcher in front of the tokenizer models (`allow_ragged_batch` inputs, so
each request keeps its own texts) hands `execute` every request that queued while the last
group was tokenized; under load the encoder then receives them in bursts and its steps grow.
Every request gets exactly one result, in order: its tensors, its own InputError, or the error
of a group that failed.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

# [(tensors, parameters)] of several requests -> per request its output tensors or the exception that answers it
Many = Callable[[Sequence[tuple[Any, Any]]], list]


def tokenize_group(many: Many, group: Sequence[tuple[Any, Any]]) -> list:
    try:
        results = many(group)
        if len(results) != len(group):
            raise RuntimeError(f"the tokenize step gave {len(results)} results for {len(group)} requests")
        return results
    except Exception as exc:  # a fault, not an input error (those are results): the group fails
        log.exception("tokenizing a group of %d requests failed", len(group))
        return [RuntimeError(f"tokenizing failed: {exc!r}")] * len(group)

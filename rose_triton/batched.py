"""The batched unary front (`embed_batched`): requests that Triton's dynamic batcher hands over together.

Its clients send one text per batch row (TEXT [B, 1], Triton's batching convention) and get one
row per text. Each `execute` receives the requests that queued while the front was busy. They
are tokenized together. Requests asking for the same outputs with the same parameters form a
group, and each group is one call to the encoder. The rows that come back are split among the
group's requests in order. Whatever fails for one request (its parameters, its texts) is that
request's error alone; a failed encoder call is the error of every request in its group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from engine_lib.errors import InputError
from engine_lib.options import parse_embedding_types
from rose_wire import INPUT_IDS, OUTPUT_OF_TYPE, SEQ_LENS, TEXT_WINDOWS

# The outputs with one row per text: the only ones a request's rows can be cut out of a group's.
ROW_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
ROW_OUTPUTS = tuple(OUTPUT_OF_TYPE[t] for t in ROW_TYPES)


def check_row_types(parameters: dict) -> None:
    """InputError if the parameter `embedding_types` names a type that is not one row per text."""
    others = [t for t in parse_embedding_types(parameters.get("embedding_types")) if t not in ROW_TYPES]
    if others:
        raise InputError(f"embedding_types {others} are not served by this batched front, which answers one row "
                         f"per text ({', '.join(ROW_TYPES)}); ask the unary front or the ensemble for them",
                         "embedding_types")


@dataclass
class Group:
    """Requests (by their index in the execute call) that go to the encoder as one call."""
    parameters: dict
    outputs: tuple[str, ...]
    members: list[int] = field(default_factory=list)


def group_requests(keyed: Sequence[tuple[int, str, dict, Sequence[str]]]) -> list[Group]:
    """(index, raw parameters, parsed parameters, wanted outputs) per request -> groups, in order of
    their first member; requests with the same raw parameters and outputs share a group."""
    groups: dict[tuple[str, tuple[str, ...]], Group] = {}
    for index, raw, parameters, outputs in keyed:
        key = (raw, tuple(outputs))
        groups.setdefault(key, Group(parameters, tuple(outputs))).members.append(index)
    return list(groups.values())


def merge_tokens(tokenized: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The tokenizer's wire tensors of several requests as one request's: ids and lengths concatenated;
    TEXT_WINDOWS (windows per text) kept when any request has them, one window a text for the rest."""
    merged = {INPUT_IDS: np.concatenate([t[INPUT_IDS] for t in tokenized]),
              SEQ_LENS: np.concatenate([t[SEQ_LENS] for t in tokenized])}
    if TEXT_WINDOWS in tokenized[0]:
        if any(t[TEXT_WINDOWS].size for t in tokenized):
            merged[TEXT_WINDOWS] = np.concatenate([
                t[TEXT_WINDOWS] if t[TEXT_WINDOWS].size else np.ones(len(t[SEQ_LENS]), dtype=np.int64)
                for t in tokenized])
        else:
            merged[TEXT_WINDOWS] = tokenized[0][TEXT_WINDOWS]
    return merged


def texts_of(tokens: dict[str, np.ndarray]) -> int:
    """How many texts (rows of the answer) one request's wire tensors carry."""
    windows = tokens.get(TEXT_WINDOWS)
    return int(windows.size) if windows is not None and windows.size else int(tokens[SEQ_LENS].size)


def split_rows(outputs: dict[str, np.ndarray], counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """A group's answer ({name: rows}) -> each request's, `counts[i]` rows in order; the rows must add up."""
    total = sum(counts)
    for name, rows in outputs.items():
        if len(rows) != total:
            raise RuntimeError(f"the encoder returned {len(rows)} rows of {name} for {total} texts")
    stops = np.cumsum(counts)
    return [{name: rows[stop - count:stop] for name, rows in outputs.items()} for count, stop in zip(counts, stops)]

"""The request text limits (TokenizerConfig / PairTokenizerConfig: texts per request, bytes
per text, bytes per request), checked here only: by the tokenizer models on TEXT tensors
and by the gateway on JSON strings, so both accept and refuse the same texts."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from engine_lib.errors import InputError, InputTooLarge
from rose_wire import TEXT


class TextLimits(Protocol):
    max_texts_per_request: int
    max_text_bytes: int
    max_request_bytes: int


def check_count(num_items: int, limits: TextLimits, name: str, what: str = "texts") -> None:
    """At least one item and at most max_texts_per_request (texts, or the gateway's token-id lists)."""
    if num_items == 0:
        raise InputError(f"{name} is empty: send at least one text", name)
    if num_items > limits.max_texts_per_request:
        raise InputTooLarge(f"{name} has {num_items} {what}; at most {limits.max_texts_per_request} per request", name)


def check_texts(items: Sequence[bytes | str], limits: TextLimits, name: str) -> list[str]:
    """UTF-8 bytes or str items -> list of str, refusing empty, oversize or non-UTF-8 items
    (named `name[i]`; sizes are UTF-8 bytes). Size refusals are InputTooLarge."""
    check_count(len(items), limits, name)
    texts = []
    total_bytes = 0
    for i, item in enumerate(items):
        text = None
        try:
            if isinstance(item, str):
                text, item = item, item.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate
            raise InputError(f"{name}[{i}] is not valid UTF-8 (character {exc.start})", name) from None
        if not isinstance(item, bytes):
            raise InputError(f"{name}[{i}] is not a string", name)
        if len(item) > limits.max_text_bytes:
            raise InputTooLarge(f"{name}[{i}] is {len(item)} bytes; at most {limits.max_text_bytes}", name)
        total_bytes += len(item)
        if total_bytes > limits.max_request_bytes:
            raise InputTooLarge(f"{name} holds more than {limits.max_request_bytes} bytes in all; split the request",
                                name)
        if text is None:
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{name}[{i}] is not valid UTF-8 (byte {exc.start})", name) from None
        if not text.strip():
            raise InputError(f"{name}[{i}] is empty or only whitespace", name)
        texts.append(text)
    return texts


def decode_texts(raw: np.ndarray, limits: TextLimits, name: str = TEXT) -> list[str]:
    """BYTES tensor -> list of str under the limits (check_texts)."""
    if raw.ndim != 1:
        raise InputError(f"{name} must be a 1-D list of strings, got shape {list(raw.shape)}", name)
    return check_texts(list(raw), limits, name)

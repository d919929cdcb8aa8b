"""TEXT tensors -> Python strings, under the request size limits (TokenizerConfig)."""
from __future__ import annotations

import numpy as np

from engine_lib.config import PairTokenizerConfig, TokenizerConfig
from engine_lib.errors import InputError


def decode_texts(raw: np.ndarray, limits: TokenizerConfig | PairTokenizerConfig, name: str = "TEXT") -> list[str]:
    """BYTES tensor -> list of str, refusing empty, oversize or non-UTF-8 items (named `name[i]`)."""
    if raw.ndim != 1:
        raise InputError(f"{name} must be a 1-D list of strings, got shape {list(raw.shape)}")
    if raw.size == 0:
        raise InputError(f"{name} is empty: send at least one text")
    if raw.size > limits.max_texts_per_request:
        raise InputError(f"{name} has {raw.size} texts; at most {limits.max_texts_per_request} per request")
    texts = []
    total_bytes = 0
    for i, item in enumerate(raw):
        if isinstance(item, str):
            item = item.encode("utf-8")
        if not isinstance(item, bytes):
            raise InputError(f"{name}[{i}] is not a string")
        if len(item) > limits.max_text_bytes:
            raise InputError(f"{name}[{i}] is {len(item)} bytes; at most {limits.max_text_bytes}")
        total_bytes += len(item)
        if total_bytes > limits.max_request_bytes:
            raise InputError(f"{name} holds more than {limits.max_request_bytes} bytes in all; split the request")
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{name}[{i}] is not valid UTF-8 (byte {exc.start})") from None
        if not text.strip():
            raise InputError(f"{name}[{i}] is empty or only whitespace")
        texts.append(text)
    return texts

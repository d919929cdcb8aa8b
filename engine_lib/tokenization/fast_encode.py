"""`encode_batch_fast` that keeps a small batch off tokenizers' thread pool.

tokenizers hands a batch of two or more inputs to its rayon pool, whose workers spin and yield
before they sleep: below POOL_MIN_CHARS characters that costs more CPU than it saves (1.2-1.5x
one-a-call's CPU for 128-token texts in batches of 2-8, 2.1-2.8x for 16-token queries in batches
of 2-3; docs/benchmarks.md, "The tokenizer's thread pool"). One input a call stays on the calling
thread, with the same ids.
"""
from __future__ import annotations

from typing import Sequence

from tokenizers import Encoding, Tokenizer

from engine_lib.tokenization.ascii_path import AsciiPathTokenizer, Input

POOL_MIN_CHARS = 8192  # where the pool's CPU per text meets one-a-call's (128-token texts, batches of 16)


def _chars(item: Input) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def encode_fast(tokenizer: Tokenizer | AsciiPathTokenizer, inputs: Sequence[Input]) -> list[Encoding]:
    """`tokenizer.encode_batch_fast(inputs)` (no character offsets): on the pool from POOL_MIN_CHARS
    characters on, else one input a call."""
    if sum(map(_chars, inputs)) >= POOL_MIN_CHARS:
        return tokenizer.encode_batch_fast(list(inputs))
    return [tokenizer.encode_batch_fast([item])[0] for item in inputs]

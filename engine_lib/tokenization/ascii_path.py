"""BertNormalizer's work on ASCII text done by Python's str methods, so that tokenizers skips it.

tokenizers' BertNormalizer walks a text one character at a time (Unicode category lookups, an
allocation for each changed character): about a third of the CPU of tokenizing a 128-token English
text (docs/benchmarks.md, "The tokenizer's ASCII path"). On a text that is all ASCII it only drops
control characters (tab, newline and carriage return become spaces) and, where the model lowercases,
lowercases: `str.translate` and `str.lower` do that in C. A text with any other character, or
holding an added token that is matched before normalization (BERT's "[MASK]"), goes through the
whole tokenizer. The ids are the same either way (tests/unit/tokenization/test_ascii_path.py).
"""
from __future__ import annotations

import json
import re
from typing import Sequence, Union

from tokenizers import Encoding, Tokenizer

Input = Union[str, tuple[str, str]]  # a text, or a (first, second) pair

# BertNormalizer(clean_text=True) on ASCII: control characters go, tab/newline/return become spaces
_CLEAN = {c: None for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F)}
_CLEAN.update({0x09: " ", 0x0A: " ", 0x0D: " "})


class AsciiPathTokenizer:
    """`encode_batch_fast` of `tokenizer` (a BertNormalizer's), ASCII inputs through a copy without
    the normalizer after Python's normalization; the same Encodings' ids and type ids."""

    def __init__(self, tokenizer: Tokenizer, normalizer: dict, raw_added: Sequence[str]):
        self.full = tokenizer
        self.bare = Tokenizer.from_str(tokenizer.to_str())  # its truncation and padding too
        self.bare.normalizer = None
        self.clean_text, self.lowercase = normalizer.get("clean_text", True), normalizer.get("lowercase", True)
        self._raw_added = re.compile("|".join(map(re.escape, raw_added))) if raw_added else None

    def normalized(self, text: str) -> str | None:
        """`text` as the BertNormalizer leaves it, or None where this path does not apply."""
        if not text.isascii():
            return None
        out = text.translate(_CLEAN) if self.clean_text else text
        if self.lowercase:
            out = out.lower()
        if self._raw_added is not None and (self._raw_added.search(text) or self._raw_added.search(out)):
            return None
        return out

    def _normalized_input(self, item: Input) -> Input | None:
        if isinstance(item, str):
            return self.normalized(item)
        first, second = self.normalized(item[0]), self.normalized(item[1])
        return None if first is None or second is None else (first, second)

    def encode_batch_fast(self, inputs: Sequence[Input]) -> list[Encoding]:
        normalized = [self._normalized_input(item) for item in inputs]
        if None not in normalized:
            return self.bare.encode_batch_fast(normalized)
        bare = iter(self.bare.encode_batch_fast([n for n in normalized if n is not None]))
        full = iter(self.full.encode_batch_fast([item for item, n in zip(inputs, normalized) if n is None]))
        return [next(full) if n is None else next(bare) for n in normalized]  # in the inputs' order


def ascii_path(tokenizer: Tokenizer) -> Tokenizer | AsciiPathTokenizer:
    """`tokenizer` behind the ASCII path where its normalizer is a BertNormalizer, else itself."""
    spec = json.loads(tokenizer.to_str())
    normalizer = spec.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return tokenizer
    raw_added = [t["content"] for t in spec.get("added_tokens", []) if not t.get("normalized", True)]
    return AsciiPathTokenizer(tokenizer, normalizer, raw_added)

"""Benchmark inputs: real English text (stdlib docstrings) cut to exact token counts."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

CORPUS = os.path.join(os.path.dirname(__file__), "data", "corpus.txt")


@dataclass
class Request:
    """One request: N texts and the same texts tokenized (flat ids + lengths)."""
    texts: list[str]
    input_ids: np.ndarray = field(repr=False)  # [sum(seq_lens)] int64
    seq_lens: np.ndarray                       # [N] int64

    @property
    def num_tokens(self) -> int:
        return int(self.seq_lens.sum())


class TextMaker:
    """Cuts windows of the corpus so that each text tokenizes to an exact length."""

    def __init__(self, tokenizer_json: str, max_length: int):
        self.tokenizer = Tokenizer.from_file(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = max_length
        with open(CORPUS) as f:
            self.corpus = " ".join(line.strip() for line in f if line.strip())
        plain = self.tokenizer.encode(self.corpus, add_special_tokens=False)
        self.offsets = plain.offsets
        # Texts start at sentence starts, like real documents.
        tokens = plain.tokens  # a property that copies the whole list: read it once
        self.starts = [i for i in range(1, len(tokens)) if tokens[i - 1] == "."]
        self.num_specials = len(self.tokenizer.encode("a").ids) - 1

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def text(self, num_tokens: int, rng: random.Random) -> str:
        """A corpus window of exactly `num_tokens` tokens (specials included) where possible."""
        body = max(1, num_tokens - self.num_specials)
        limit = len(self.offsets) - body - 1
        start = self.starts[rng.randrange(len(self.starts))] % max(1, limit)
        end = start + body
        text = ""
        for _ in range(8):  # re-tokenizing a window can shift by a few tokens
            end = min(max(end, start + 1), len(self.offsets))
            text = self.corpus[self.offsets[start][0]:self.offsets[end - 1][1]]
            diff = num_tokens - self.count(text)
            if diff == 0:
                break
            end += diff
        return text

    def request(self, texts: list[str]) -> Request:
        encodings = self.tokenizer.encode_batch(texts)
        ids = [e.ids[:self.max_length] for e in encodings]
        seq_lens = np.array([len(x) for x in ids], dtype=np.int64)
        return Request(texts, np.fromiter((t for x in ids for t in x), dtype=np.int64, count=int(seq_lens.sum())),
                       seq_lens)

    def requests(self, num_requests: int, batch: int, seq_len: int | str, mixed_max: int = 256,
                 seed: int = 0) -> list[Request]:
        """`num_requests` requests of `batch` texts; seq_len an int or "mixed" (uniform 8..mixed_max)."""
        rng = random.Random(f"{seed}-{batch}-{seq_len}")
        out = []
        for _ in range(num_requests):
            lengths = [rng.randint(8, mixed_max) if seq_len == "mixed" else int(seq_len) for _ in range(batch)]
            out.append(self.request([self.text(n, rng) for n in lengths]))
        return out

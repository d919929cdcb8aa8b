"""Split a job into consecutive chunks sized by token count."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int  # texts[start:stop]
    stop: int
    num_tokens: int

    @property
    def num_texts(self) -> int:
        return self.stop - self.start


def plan_chunks(token_counts: Sequence[int], max_chunk_tokens: int, max_chunk_texts: int,
                max_text_tokens: int | None = None) -> list[Chunk]:
    """Greedy, in input order: a chunk grows until the next text would pass either
    limit. A text longer than max_chunk_tokens goes alone. Deterministic, so a
    resumed job sees the same chunks. `max_text_tokens` caps each count (the
    server truncates there)."""
    if max_chunk_tokens < 1 or max_chunk_texts < 1:
        raise ValueError("max_chunk_tokens and max_chunk_texts must be >= 1")
    chunks: list[Chunk] = []
    start, tokens = 0, 0
    for i, count in enumerate(token_counts):
        if max_text_tokens is not None:
            count = min(count, max_text_tokens)
        full = tokens + count > max_chunk_tokens or i - start >= max_chunk_texts
        if i > start and full:
            chunks.append(Chunk(len(chunks), start, i, tokens))
            start, tokens = i, 0
        tokens += count
    if len(token_counts) > start:
        chunks.append(Chunk(len(chunks), start, len(token_counts), tokens))
    return chunks


def plan_fingerprint(chunks: Sequence[Chunk]) -> str:
    """Identifies a chunk plan (boundaries only), for resume checks."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(f"{chunk.start}:{chunk.stop};".encode())
    return digest.hexdigest()

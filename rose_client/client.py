"""EmbeddingClient: embed any number of texts over a list of replicas."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .chunking import Chunk, plan_chunks
from .dispatch import Dispatcher, RetryPolicy
from .replicas import resolve_replicas
from .stream import StreamSlot
from .tokens import ByteEstimator, TokenCounter

ProgressCallback = Callable[[int, int], None]  # (texts done, texts in the job)


class EmbeddingClient:
    """Splits a job into token-sized chunks, spreads them over the replicas (gRPC
    streaming on `model`), retries failures elsewhere, returns rows in input order.
    Request `parameters` (normalize, dimensions, input_type, truncate) pass through."""

    def __init__(self, urls: Sequence[str], *, model: str = "ensemble", max_inflight_per_replica: int = 4,
                 max_chunk_tokens: int = 4096, max_chunk_texts: int = 256, max_text_tokens: int | None = None,
                 token_counter: TokenCounter | None = None, request_timeout: float = 300.0,
                 retry: RetryPolicy = RetryPolicy()):
        self.urls = resolve_replicas(list(urls))
        self.model = model
        self.max_inflight_per_replica = max_inflight_per_replica
        self.max_chunk_tokens = max_chunk_tokens
        self.max_chunk_texts = max_chunk_texts
        self.max_text_tokens = max_text_tokens
        self.token_counter = token_counter or ByteEstimator()
        self.request_timeout = request_timeout
        self.retry = retry
        self.last_dispatcher: Dispatcher | None = None  # per-replica counts of the last job

    def plan(self, texts: Sequence[str]) -> list[Chunk]:
        _check_texts(texts)
        return plan_chunks(self.token_counter.count(texts), self.max_chunk_tokens, self.max_chunk_texts,
                           self.max_text_tokens)

    def embed(self, texts: Sequence[str], parameters: dict | None = None,
              on_progress: ProgressCallback | None = None) -> np.ndarray:
        """-> float32 [len(texts), D], row i for texts[i]."""
        chunks = self.plan(texts)
        parts: dict[int, np.ndarray] = {}

        def keep(chunk: Chunk, rows: np.ndarray) -> None:
            parts[chunk.index] = rows

        self.run(texts, chunks, keep, parameters, on_progress)
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.concatenate([parts[c.index] for c in chunks]).astype(np.float32, copy=False)

    def run(self, texts: Sequence[str], chunks: Sequence[Chunk], on_chunk: Callable[[Chunk, np.ndarray], None],
            parameters: dict | None = None, on_progress: ProgressCallback | None = None,
            texts_done: int = 0) -> None:
        """Embed `chunks` (a subset of a plan, e.g. what a resumed job still lacks);
        `on_chunk` gets each chunk's rows once, in completion order, in this thread."""
        dispatcher = Dispatcher(self.urls, self._slot, self.max_inflight_per_replica, self.retry)
        self.last_dispatcher = dispatcher
        total, done = texts_done + sum(c.num_texts for c in chunks), texts_done

        def deliver(chunk: Chunk, rows: np.ndarray) -> None:
            nonlocal done
            on_chunk(chunk, rows)
            done += chunk.num_texts
            if on_progress is not None:
                on_progress(done, total)

        dispatcher.run(chunks, lambda c: list(texts[c.start:c.stop]), deliver, parameters)

    def _slot(self, url: str) -> StreamSlot:
        return StreamSlot(url, self.model, self.request_timeout)


def _check_texts(texts: Sequence[str]) -> None:
    """The server refuses these; refusing them here keeps retries for real failures."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
        if not text.strip():
            raise ValueError(f"texts[{i}] is empty or only whitespace")

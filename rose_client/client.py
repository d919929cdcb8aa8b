"""EmbeddingClient: embed any number of texts over a list of replicas."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from rose_wire import EMBEDDINGS, ENSEMBLE, TEXT

from .aio import AsyncDispatcher, JobFailed
from .aio_stream import AsyncStreamSlot, Call, ReplicaChannel, ReplicaError
from .chunking import Chunk, plan_chunks
from .identity import PROBE_TEXT, ModelIdentity, ModelMismatch
from .replicas import resolve_replicas
from .scheduling import RetryPolicy
from .tokens import ByteEstimator, TokenCounter

ProgressCallback = Callable[[int, int], None]  # (texts done, texts in the job)


class EmbeddingClient:
    """Splits a job into token-sized chunks, spreads them over the replicas (gRPC
    streaming on `model`: `ensemble`, or a model served by name), retries failures elsewhere,
    returns rows in input order.
    Request `parameters` (normalize, dimensions, input_type, truncate, priority_class) pass through;
    a job's chunks get the encoder's default class by their own size unless `priority_class` is set
    (the bulk tool sends batch).
    Each call runs the asyncio dispatcher (aio.py) on an event loop of its own."""

    def __init__(self, urls: Sequence[str], *, model: str = ENSEMBLE, max_inflight_per_replica: int = 4,
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
        self.last_dispatcher: AsyncDispatcher | None = None  # per-replica counts of the last job

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
        `on_chunk` gets each chunk's rows once, in completion order, on one thread: this
        one, or a helper thread when this one already runs an event loop (a notebook)."""
        if not chunks:
            return
        total, done = texts_done + sum(c.num_texts for c in chunks), texts_done

        def deliver(chunk: Chunk, rows: np.ndarray) -> None:
            nonlocal done
            on_chunk(chunk, rows)
            done += chunk.num_texts
            if on_progress is not None:
                on_progress(done, total)

        def call(chunk: Chunk) -> Call:
            batch = np.array([t.encode("utf-8") for t in texts[chunk.start:chunk.stop]], dtype=np.object_)
            return Call(self.model, {TEXT: batch}, EMBEDDINGS, parameters or {}, rows=chunk.num_texts)

        _run_to_end(self._run(chunks, call, deliver))

    def model_identity(self, parameters: dict | None = None) -> tuple[ModelIdentity, dict[str, str]]:
        """Embed identity.PROBE_TEXT on every replica (with `parameters`, all dimensions) ->
        (the served model's identity, {url: why} of replicas that did not answer). Those are
        dropped from `urls`, so no job runs on a model nobody checked; raises ModelMismatch
        when the replicas that answer serve different models, JobFailed when none answers."""
        probes = _run_to_end(self._probe({**(parameters or {}), "dimensions": 0}))
        silent = {url: str(result) for url, result in probes.items() if isinstance(result, ReplicaError)}
        identities = {url: ModelIdentity.from_probe(self.model, rows[0])
                      for url, rows in probes.items() if url not in silent}
        if not identities:
            raise JobFailed(f"no replica answered the model probe: {silent}")
        first_url, first = next(iter(identities.items()))
        for url, identity in identities.items():
            if not identity.matches(first):
                raise ModelMismatch(f"replicas serve different models: {first_url} {first}, {url} {identity}")
        self.urls = [url for url in self.urls if url in identities]
        return first, silent

    async def _probe(self, parameters: dict) -> dict:
        channels = {url: ReplicaChannel(url) for url in self.urls}
        call = Call(self.model, {TEXT: np.array([PROBE_TEXT.encode()], dtype=np.object_)}, EMBEDDINGS, parameters, rows=1)

        async def probe(url: str):
            slot = AsyncStreamSlot(channels[url], self.request_timeout)
            try:
                return await slot.call(call)
            except ReplicaError as exc:
                return exc
            finally:
                await slot.close()

        try:
            return dict(zip(self.urls, await asyncio.gather(*(probe(url) for url in self.urls))))
        finally:
            for channel in channels.values():
                await channel.close()

    async def _run(self, chunks: Sequence[Chunk], call: Callable[[Chunk], Call],
                   deliver: Callable[[Chunk, np.ndarray], None]) -> None:
        channels = {url: ReplicaChannel(url) for url in self.urls}
        dispatcher = AsyncDispatcher(self.urls, lambda url: AsyncStreamSlot(channels[url], self.request_timeout),
                                     self.max_inflight_per_replica, self.retry)
        self.last_dispatcher = dispatcher
        await dispatcher.start()
        try:
            await dispatcher.run(chunks, call, deliver)
        finally:
            await dispatcher.close()
            for channel in channels.values():
                await channel.close()


def _run_to_end(coroutine):
    """Run `coroutine` on an event loop of its own -> its result."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no event loop in this thread
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:  # e.g. a notebook's loop: run ours beside it
        return pool.submit(asyncio.run, coroutine).result()


def _check_texts(texts: Sequence[str]) -> None:
    """The server refuses these; refusing them here keeps retries for real failures."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
        if not text.strip():
            raise ValueError(f"texts[{i}] is empty or only whitespace")

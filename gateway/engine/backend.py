"""The Triton side: replicas (DNS-resolved, health-checked), the async chunk
dispatcher from rose_client, and the calls the API makes (embed, embed_types,
int8_ranges, rerank), each to the Triton model its route names (gateway/engine/routing.py);
one dispatcher serves every model.

The health and DNS loops survive their own failures: an exception in one round
is logged and the next round runs. A replica that DNS no longer lists takes no
new chunks; its channel closes once the chunks in flight there have finished."""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import numpy as np

from engine_lib.contract import RaggedTokens
from rose_client.aio import AsyncDispatcher
from rose_client.aio_stream import AsyncStreamSlot, Call, ReplicaChannel
from rose_client.chunking import Chunk, plan_chunks
from rose_client.coalesce import Merge, parameters_key
from rose_client.replicas import resolve_replicas
from rose_client.scheduling import RetryPolicy
from rose_wire import (
    DOCUMENTS,
    EMBEDDINGS,
    INPUT_IDS,
    INT8_RANGES,
    OUTPUT_OF_TYPE,
    QUERY,
    RERANK,
    ROSE_ENCODER,
    SCORES,
    SEQ_LENS,
    TEXT_WINDOWS,
)

from engine_lib import tracing
from engine_lib.options import BATCH, PRIORITY_PARAMETER

from .. import stages
from ..config import GatewayConfig
from ..metrics import GatewayMetrics

log = logging.getLogger("gateway")
SERVICE = "rose-gateway"  # the traces' service name unless OTEL_SERVICE_NAME
TYPE_OF_OUTPUT = {name: kind for kind, name in OUTPUT_OF_TYPE.items()}


# Set while a batch job's line runs (gateway/http/inprocess.py): its calls go at the `batch`
# class, whatever the line asks, so jobs yield to live traffic on the encoders,
# and their chunks run in the background (rose_client/aio.py: a slot per replica stays for live requests).
IN_BATCH_JOB: contextvars.ContextVar[bool] = contextvars.ContextVar("in_batch_job", default=False)


def job_class(parameters: dict) -> dict:
    return {**parameters, PRIORITY_PARAMETER: BATCH} if IN_BATCH_JOB.get() else parameters


class Backend:
    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics, targets: tuple[str, ...] = ()):
        """`targets`: the Triton models of the models served by name whose readiness is checked."""
        self.config = config
        self.metrics = metrics
        self.channels: dict[str, ReplicaChannel] = {}
        self.ready: dict[str, bool] = {}
        self.rerank_ready: dict[str, bool] = {}
        self.targets = tuple(targets)
        self.target_ready: dict[str, dict[str, bool]] = {}  # {Triton model: {replica: ready}}
        self.dispatcher: AsyncDispatcher | None = None
        self.loops: list[asyncio.Task] = []

    async def start(self) -> None:
        urls = await self._resolve()
        retry = RetryPolicy(max_attempts=self.config.max_chunk_attempts, base_cooldown_s=0.1, max_cooldown_s=2.0,
                            max_unavailable_s=10.0)
        self.dispatcher = AsyncDispatcher(urls, self._slot, self.config.max_inflight_per_replica, retry,
                                          on_retry=lambda url, exc: self.metrics.retries.labels(url).inc())
        await self.dispatcher.start()
        await self._check_health()
        self.loops = [asyncio.create_task(self._health_loop()), asyncio.create_task(self._dns_loop())]

    async def close(self) -> None:
        for task in self.loops:
            task.cancel()
        await asyncio.gather(*self.loops, return_exceptions=True)
        if self.dispatcher is not None:
            await self.dispatcher.close()
        for channel in self.channels.values():
            await channel.close()

    @property
    def any_ready(self) -> bool:
        return any(self.ready.values())

    @property
    def reranker_served(self) -> bool:
        return any(self.rerank_ready.values())

    def serves(self, model: str) -> bool:
        """Some replica has Triton model `model` ready (the default encoder, `rerank` or a target)."""
        if model == ROSE_ENCODER:
            return self.any_ready
        if model == RERANK:
            return self.reranker_served
        return any(self.target_ready.get(model, {}).values())

    def _channel(self, url: str) -> ReplicaChannel:
        if url not in self.channels:
            self.channels[url] = ReplicaChannel(url)
        return self.channels[url]

    def _slot(self, url: str) -> AsyncStreamSlot:
        return AsyncStreamSlot(self._channel(url), self.config.request_timeout_s)

    async def _resolve(self) -> list[str]:
        return await asyncio.get_running_loop().run_in_executor(None, resolve_replicas, list(self.config.triton))

    async def _check_health(self) -> None:
        urls = self.dispatcher.urls
        ready = await asyncio.gather(*(self._channel(u).is_ready(ROSE_ENCODER) for u in urls))
        rerank = await asyncio.gather(*(self._channel(u).is_ready(RERANK) for u in urls))
        targets = await asyncio.gather(*(self._channel(u).is_ready(m) for m in self.targets for u in urls))
        for url, now_ready in zip(urls, ready):
            if self.ready.get(url) != now_ready:
                log.info("replica %s %s", url, "ready" if now_ready else "not ready")
            if not now_ready:  # e.g. stopping: let it exit without waiting for our idle streams
                self._channel(url).drop_idle_streams()
        self.ready, self.rerank_ready = dict(zip(urls, ready)), dict(zip(urls, rerank))
        self.target_ready = {m: dict(zip(urls, targets[i * len(urls):(i + 1) * len(urls)]))
                             for i, m in enumerate(self.targets)}
        await self._close_drained_channels()

    async def _health_loop(self) -> None:
        await self._every(self.config.health_interval_s, self._check_health, "health check")

    async def _dns_loop(self) -> None:
        if not any(a.startswith("dns:///") for a in self.config.triton):
            return
        await self._every(self.config.dns_refresh_s, self._refresh_replicas, "replica refresh")

    @staticmethod
    async def _every(interval_s: float, step, name: str) -> None:
        """Run `step` every `interval_s` until cancelled; a round that fails is logged, not fatal."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except Exception:
                log.exception("%s failed; next try in %gs", name, interval_s)

    async def _refresh_replicas(self) -> None:
        try:
            urls = await self._resolve()
        except (OSError, ValueError) as exc:  # keep the last good list
            log.warning("resolving %s failed: %s", self.config.triton, exc)
            urls = self.dispatcher.urls
        if urls != self.dispatcher.urls:
            log.info("replicas now %s", urls)
            self.dispatcher.set_replicas(urls)  # a dropped replica's chunks in flight finish there

    async def _close_drained_channels(self) -> None:
        """Close the channels of dropped replicas once no chunk is in flight there (each health round)."""
        served = set(self.dispatcher.urls)
        for url in [u for u in self.channels if u not in served and not self.dispatcher.has_workers(u)]:
            await self.channels.pop(url).close()

    async def embed(self, tokens: RaggedTokens, parameters: dict, encoder: str = ROSE_ENCODER) -> np.ndarray:
        """-> float32 [num_inputs, D] in input order from Triton model `encoder`; raises rose_client's
        JobFailed. An input's windows (chunking) stay in one chunk: the encoder pools them."""
        parameters = job_class(parameters)
        chunks = plan_chunks(tokens.text_tokens, self.config.max_chunk_tokens, self.config.max_chunk_texts)
        offsets, windows = tokens.offsets, tokens.window_offsets

        def call(chunk: Chunk) -> Call:
            first, last = windows[chunk.start], windows[chunk.stop]
            tensors = {INPUT_IDS: tokens.input_ids[offsets[first]:offsets[last]],
                       SEQ_LENS: tokens.seq_lens[first:last]}
            if tokens.windows is not None:
                tensors[TEXT_WINDOWS] = tokens.windows[chunk.start:chunk.stop]
            return Call(encoder, tensors, EMBEDDINGS, parameters, rows=chunk.num_texts)

        self.metrics.chunks.labels("embeddings").inc(len(chunks))
        # waiting chunks of other requests to the same encoder, alike (parameters, windows or not), may share a call
        merge = Merge((encoder, tokens.windows is not None, parameters_key(parameters)), self.config.max_chunk_tokens,
                      self.config.max_chunk_texts)
        parts = await self._run(chunks, call, merge)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def embed_types(self, tokens: RaggedTokens, types: list[str], dimensions: int,
                          encoder: str = ROSE_ENCODER) -> dict[str, np.ndarray]:
        """-> {type: [num_inputs, ...] array in input order} for `types` (keys of rose_wire.OUTPUT_OF_TYPE)
        from Triton model `encoder`: it computes every type (engine_lib/service/outputs.py) and answers
        the tensors named (requested outputs, and the same list as its `embedding_types` parameter)."""
        names = tuple(OUTPUT_OF_TYPE[t] for t in dict.fromkeys(types))
        parameters = job_class({"embedding_types": ",".join(TYPE_OF_OUTPUT[n] for n in names),
                                **({"dimensions": dimensions} if dimensions else {})})
        chunks = plan_chunks(tokens.seq_lens.tolist(), self.config.max_chunk_tokens, self.config.max_chunk_texts)
        offsets = tokens.offsets

        def call(chunk: Chunk) -> Call:
            ids = tokens.input_ids[offsets[chunk.start]:offsets[chunk.stop]]
            return Call(encoder, {INPUT_IDS: ids, SEQ_LENS: tokens.seq_lens[chunk.start:chunk.stop]},
                        names[0], parameters, rows=chunk.num_texts, outputs=names)

        self.metrics.chunks.labels("embed_v2").inc(len(chunks))
        parts = await self._run(chunks, call)
        return {TYPE_OF_OUTPUT[n]: np.concatenate([p[n] for p in parts]) for n in names}

    async def int8_ranges(self, dimensions: int, encoder: str = ROSE_ENCODER) -> np.ndarray:
        """The served model's int8 ranges [2, D] (D = `dimensions`, 0: all): the encoder answers a
        request for INT8_RANGES alone from its calibration, without running the one token sent."""
        chunks = plan_chunks([1], 1, 1)
        parameters = {"embedding_types": "int8_ranges", **({"dimensions": dimensions} if dimensions else {})}
        sequence = {INPUT_IDS: np.zeros(1, dtype=np.int64), SEQ_LENS: np.ones(1, dtype=np.int64)}
        (ranges,) = await self._run(chunks, lambda chunk: Call(encoder, sequence, INT8_RANGES, parameters, rows=2),
                                    inputs=False)
        return ranges

    async def rerank(self, query: str, documents: list[str], parameters: dict, model: str = RERANK) -> np.ndarray:
        """-> float32 [num_documents] scores from the reranker ensemble `model`, document order;
        chunks of documents share the query."""
        parameters = job_class(parameters)
        chunks = plan_chunks([1] * len(documents), self.config.max_rerank_chunk_documents,
                             self.config.max_rerank_chunk_documents)
        query_tensor = np.array([query.encode()], dtype=np.object_)

        def call(chunk: Chunk) -> Call:
            docs = np.array([d.encode() for d in documents[chunk.start:chunk.stop]], dtype=np.object_)
            return Call(model, {QUERY: query_tensor, DOCUMENTS: docs}, SCORES, parameters,
                        rows=chunk.num_texts)

        self.metrics.chunks.labels("rerank").inc(len(chunks))
        limit = self.config.max_rerank_chunk_documents  # the wire carries one query: same query, same call
        merge = Merge((model, query, parameters_key(parameters)), limit, limit, frozenset({QUERY}))
        parts = await self._run(chunks, call, merge)
        return np.concatenate(parts).reshape(-1)

    async def _run(self, chunks: list[Chunk], call, merge: Merge | None = None, inputs: bool = True) -> list:
        """The dispatcher's run of `chunks`, marking the request's stages (gateway/stages.py): when its
        first chunk leaves the queue and when the last is answered; `inputs`: its chunks' texts count
        as the request's inputs."""
        record = stages.current()
        if record is None:
            return await self.dispatcher.run(chunks, call, merge=merge, background=IN_BATCH_JOB.get())
        if inputs:
            record.inputs += sum(chunk.num_texts for chunk in chunks)
        if record.span is not None:  # traces on (engine_lib/tracing.py): a span per encoder call
            from .. import traced

            spans = traced.CallSpans(tracing.tracer(SERVICE), record, call)
            call, merge = spans.sent, traced.traced_merge(merge)

        def sent(chunk: Chunk) -> Call:
            if not record.first_sent:
                record.first_sent = time.perf_counter()
            return call(chunk)

        if record.span is None:
            try:
                return await self.dispatcher.run(chunks, sent, merge=merge, background=IN_BATCH_JOB.get())
            finally:
                record.answered = time.perf_counter()
        try:
            await self.dispatcher.run(chunks, sent, spans.answered, merge=merge, background=IN_BATCH_JOB.get())
            return [spans.results[chunk.index] for chunk in chunks]
        finally:
            record.answered = time.perf_counter()
            spans.close()

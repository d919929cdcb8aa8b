"""Texts and token-id inputs -> RaggedTokens (engine_lib/contract.py), with the tokenizer
model's own code (engine_lib.tokenization.text) and settings (its config.pbtxt and
the launcher's ROSE_* overrides, read by rose_triton.parameters), so the ids equal
the ensemble path's, and its request limits (engine_lib.tokenization.text_input).
TokenizeQueue tokenizes the texts of concurrent requests together, off the event loop."""
from __future__ import annotations

import asyncio
import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engine_lib.config import TokenizerConfig
from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.model_folder import ModelFolder
from engine_lib.options import RequestOptions
from engine_lib.tokenization.colbert import text_tokenizer
from engine_lib.tokenization.text_input import check_count, check_texts
from rose_triton.parameters import config_from_pbtxt

from ..errors import ApiError, bad_request, from_input_error

log = logging.getLogger("gateway")


def _input_error(exc: InputError) -> ApiError:
    """A request's refusal as the gateway answers it: 400 (413 for InputTooLarge), naming `input[i]`."""
    return from_input_error(type(exc)(str(exc).replace("TEXT[", "input["), exc.field), "input")


class GatewayTokenizer:
    def __init__(self, tokenizer_config: str | TokenizerConfig, model_dir: str = ""):
        """`tokenizer_config`: a config.pbtxt, or the settings themselves (a model served by name);
        `model_dir` (--model-dir) over ROSE_MODEL_DIR over the config.pbtxt's."""
        if isinstance(tokenizer_config, TokenizerConfig):
            self.config = tokenizer_config
        else:
            self.config = config_from_pbtxt(TokenizerConfig, tokenizer_config, model_dir=model_dir or None)
        folder = ModelFolder.open(self.config.model_dir)
        self.model_dir = folder.path
        self.text = text_tokenizer(folder, self.config)
        self.max_length = self.text.max_length
        vocab_size = folder.config.get("vocab_size")
        self.vocab_size = vocab_size if isinstance(vocab_size, int) else self.text.vocab_size()
        hidden_size = folder.config.get("hidden_size")  # the embedding rows' width (engine_lib.models.heads)
        self.output_dim = hidden_size if isinstance(hidden_size, int) and hidden_size > 0 else None

    def check_texts(self, texts: list[str]) -> None:
        """The tokenizer model's limits, as HTTP statuses (size -> 413, content -> 400)."""
        try:
            check_texts(texts, self.config, "input")
        except InputError as exc:
            raise from_input_error(exc) from None

    def encode_texts(self, texts: list[str], options: RequestOptions) -> RaggedTokens:
        result = self.encode_many([(texts, options)])[0]
        if isinstance(result, ApiError):
            raise result
        return result

    def encode_many(self, requests: list[tuple[list[str], RequestOptions]]) -> list[RaggedTokens | ApiError]:
        """Several requests tokenized together (chunking=mean ones each on their own: their
        windows); a refused one gets its error (400; 413 past max_windows_per_text), the others their ids."""
        results: list = [None] * len(requests)
        plain = [r for r, (_, options) in enumerate(requests) if options.chunking != "mean"]
        for r, result in zip(plain, self.text.encode_many([requests[r] for r in plain])):
            results[r] = result
        for r, (texts, options) in enumerate(requests):
            if options.chunking == "mean":
                try:
                    results[r] = self.text.encode_windows(texts, options)
                except InputError as exc:
                    results[r] = exc
        return [_input_error(r) if isinstance(r, InputError) else r for r in results]

    def encode_ids(self, inputs: list[list[int]], truncate: bool, direction: str = "right") -> RaggedTokens:
        """Token-id inputs go to the encoder as given (no template, no special tokens); an
        over-long one is cut at its end (`direction` right) or its start (left)."""
        try:
            check_count(len(inputs), self.config, "input", "token-id inputs")
        except InputError as exc:
            raise from_input_error(exc) from None
        rows = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise bad_request(f"input[{i}] is an empty list of token ids", "input")
            if len(ids) > self.max_length:
                if not truncate:
                    raise bad_request(f"input[{i}] has {len(ids)} tokens, more than the model's maximum of "
                                      f"{self.max_length}, and truncate=false", "input")
                ids = ids[-self.max_length:] if direction == "left" else ids[:self.max_length]
            rows.append(ids)
        try:
            tokens = RaggedTokens.from_rows(rows)
        except OverflowError:
            raise bad_request(f"input holds a token id outside [0, {self.vocab_size})", "input") from None
        bad = (tokens.input_ids < 0) | (tokens.input_ids >= self.vocab_size)
        if bad.any():
            at = int(np.argmax(bad))
            row = int(np.searchsorted(np.cumsum(tokens.seq_lens), at, side="right"))
            raise bad_request(f"input[{row}] holds token id {int(tokens.input_ids[at])}, outside "
                              f"[0, {self.vocab_size})", "input")
        return tokens


@dataclass
class _Waiting:
    texts: list[str]
    options: RequestOptions
    future: asyncio.Future
    chars: int


class TokenizeQueue:
    """`await encode(texts, options)`: the texts of requests that wait to be tokenized go
    together in a worker thread (tokenizers releases the GIL; a large batch also spreads over
    its own threads, engine_lib/tokenization/fast_encode.py), so the event loop keeps serving
    meanwhile. A free lane takes what waits at once (no timer); requests that arrive while every
    lane is busy wait and go together in the next batch, up to `max_batch_chars` of text (a
    larger request goes alone)."""

    def __init__(self, tokenizer: GatewayTokenizer, lanes: int = 2, max_batch_chars: int = 256 << 10):
        self.tokenizer = tokenizer
        self.lanes = lanes
        self.max_batch_chars = max_batch_chars
        self.pool = ThreadPoolExecutor(lanes, thread_name_prefix="tokenize")
        self.waiting: collections.deque[_Waiting] = collections.deque()
        self.running = 0  # lanes at work; a lane leaves in the same step it finds nothing waiting
        self._lanes: set[asyncio.Task] = set()  # referenced until done
        self.batches = 0  # batches tokenized (for tests and the perf script)

    async def encode(self, texts: list[str], options: RequestOptions) -> RaggedTokens:
        """-> the ids; raises the request's ApiError (400) as `encode_texts` does."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(_Waiting(texts, options, future, sum(map(len, texts))))
        if self.running < self.lanes:
            self.running += 1
            lane = asyncio.ensure_future(self._lane())
            self._lanes.add(lane)
            lane.add_done_callback(self._lanes.discard)
        result = await future
        if isinstance(result, ApiError):
            raise result
        return result

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _next_batch(self) -> list[_Waiting]:
        batch, chars = [], 0
        while self.waiting and (not batch or chars + self.waiting[0].chars <= self.max_batch_chars):
            item = self.waiting.popleft()
            if not item.future.done():  # its request left meanwhile
                batch.append(item)
                chars += item.chars
        return batch

    async def _lane(self) -> None:
        try:
            await self._drain()
        finally:
            self.running -= 1

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while batch := self._next_batch():
            try:
                try:
                    results = await loop.run_in_executor(self.pool, self.tokenizer.encode_many,
                                                         [(item.texts, item.options) for item in batch])
                    self.batches += 1
                except Exception:  # a fault, not an input refusal (those are results): each request alone
                    results = await self._one_by_one(batch)
            except BaseException:  # cancelled (the loop closes): the requests of the batch end too
                for item in batch:
                    item.future.cancel()
                raise
            for item, result in zip(batch, results):
                if not item.future.done():
                    item.future.set_result(result)

    async def _one_by_one(self, batch: list[_Waiting]) -> list:
        loop = asyncio.get_running_loop()
        results = []
        for item in batch:
            try:
                results += await loop.run_in_executor(self.pool, self.tokenizer.encode_many,
                                                      [(item.texts, item.options)])
            except Exception:
                log.exception("tokenizing a request failed")
                results.append(ApiError(500, "internal error"))
        return results

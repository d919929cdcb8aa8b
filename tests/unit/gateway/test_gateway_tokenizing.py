"""Bulk tokenization (gateway/engine/tokenizing.py TokenizeQueue): the texts of requests that wait
go through one encode_batch, each request gets exactly the ids it would get alone, and a
refused or failing request does not fail the others."""
import asyncio
import threading

import numpy as np
import pytest

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from gateway.config import DEFAULT_TOKENIZER_CONFIG
from gateway.engine.tokenizing import GatewayTokenizer, TokenizeQueue
from gateway.errors import ApiError


@pytest.fixture(scope="module")
def tokenizer():
    return GatewayTokenizer(str(DEFAULT_TOKENIZER_CONFIG))


class HeldTokenizer:
    """The gateway's tokenizer, recording each batch; the first batch waits for `release`."""

    def __init__(self, tokenizer, fail_on=None):
        self.tokenizer, self.fail_on = tokenizer, fail_on
        self.batches, self.release, self.entered = [], threading.Event(), threading.Event()

    def encode_many(self, requests):
        self.batches.append([texts for texts, _ in requests])
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(30)
        if self.fail_on is not None and any(self.fail_on in texts for texts, _ in requests):
            raise RuntimeError("a tokenizer fault")
        return self.tokenizer.encode_many(requests)


def run_held(held, requests):
    """The first request takes the only lane and is held; the others wait, then go."""
    async def scenario():
        queue = TokenizeQueue(held, lanes=1)
        try:
            first = asyncio.ensure_future(queue.encode(*requests[0]))
            assert await asyncio.to_thread(held.entered.wait, 30)
            rest = [asyncio.ensure_future(queue.encode(*r)) for r in requests[1:]]
            await asyncio.sleep(0)
            assert len(queue.waiting) == len(rest)
            held.release.set()
            return await asyncio.wait_for(asyncio.gather(first, *rest, return_exceptions=True), 60)
        finally:
            queue.close()

    return asyncio.run(scenario())


def test_waiting_requests_share_one_batch_with_their_own_ids(tokenizer, model_dir):
    long_text = "word " * 600  # over the model's 256 tokens
    requests = [(["held"], RequestOptions()),
                (["a query", "another"], RequestOptions(input_type="query")),
                ([long_text, "short"], RequestOptions(truncate=True)),
                (["fine", long_text], RequestOptions(truncate=False)),
                (["a document"], RequestOptions(input_type="document"))]
    held = HeldTokenizer(tokenizer)
    results = run_held(held, requests)
    assert [len(b) for b in held.batches] == [1, 4]  # everything that waited went in one batch
    alone = TextTokenizer(model_dir, TokenizerConfig())
    for (texts, options), result in zip(requests, results):
        if not options.truncate:
            assert isinstance(result, ApiError) and result.status == 400 and result.param == "input"
            assert "input[1] has" in result.message  # its own index, not the batch's
            continue
        tokens = alone.encode(texts, options)
        ids, lens = tokens.input_ids, tokens.seq_lens
        np.testing.assert_array_equal(result.input_ids, ids)
        np.testing.assert_array_equal(result.seq_lens, lens)


def test_a_fault_in_a_batch_fails_only_its_request(tokenizer):
    held = HeldTokenizer(tokenizer, fail_on="boom")
    held.release.set()
    requests = [(["good one"], RequestOptions()), (["boom"], RequestOptions()), (["good two"], RequestOptions())]

    async def scenario():
        queue = TokenizeQueue(held, lanes=1)
        try:
            return await asyncio.wait_for(asyncio.gather(*(queue.encode(*r) for r in requests),
                                                         return_exceptions=True), 60)
        finally:
            queue.close()

    results = asyncio.run(scenario())
    assert [len(b) for b in held.batches] == [3, 1, 1, 1]  # the batch failed: each request again alone
    assert [r.status if isinstance(r, ApiError) else "ok" for r in results] == ["ok", 500, "ok"]
    np.testing.assert_array_equal(results[2].input_ids, tokenizer.encode_texts(["good two"], RequestOptions()).input_ids)


def test_a_request_right_after_a_batch_is_served(tokenizer):
    """A lane that finds nothing waiting leaves at once: the next request starts a new one."""
    async def scenario():
        queue = TokenizeQueue(tokenizer, lanes=1)
        try:
            return [await queue.encode([f"text {i}"], RequestOptions()) for i in range(5)]  # in this task
        finally:
            queue.close()

    results = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [int(r.seq_lens.sum()) for r in results] == [
        int(tokenizer.encode_texts([f"text {i}"], RequestOptions()).seq_lens.sum()) for i in range(5)]

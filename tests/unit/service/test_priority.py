"""Priority classes through the Endpoint and the service: the `priority` option and its default rule,
interactive work ahead of queued batch work, per-class metrics, and rows unchanged by the class
(batched == alone on a real tiny model)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine_lib.contract import RaggedTokens
from engine_lib.errors import InputError
from engine_lib.options import (
    BATCH,
    INTERACTIVE,
    INTERACTIVE_MAX_TEXTS,
    INTERACTIVE_MAX_TOKENS,
    RequestOptions,
    RerankOptions,
    default_priority,
)
from engine_lib.service.endpoint import Endpoint
from rose_wire import EMBEDDINGS
from testing.fake_engine import FakeEngine, Replies, expected_row, make_service
from testing.waiting import wait_until

RAW = RequestOptions(normalize=False)


@pytest.mark.parametrize("options_type", [RequestOptions, RerankOptions])
def test_priority_class_parameter_takes_the_two_classes_and_names_itself_when_wrong(options_type):
    assert options_type.from_parameters({}).priority == ""
    assert options_type.from_parameters({"priority_class": None}).priority == ""
    assert options_type.from_parameters('{"priority_class": "batch"}').priority == BATCH
    assert options_type.from_parameters({"priority_class": "interactive"}).priority == INTERACTIVE
    for bad in ("urgent", "", "BATCH", 1, ["batch"]):
        with pytest.raises(InputError, match="'priority_class' must be one of") as refused:
            options_type.from_parameters({"priority_class": bad})
        assert refused.value.field == "priority_class"


def test_default_rule_by_texts_and_tokens():
    assert default_priority(1, 10) == INTERACTIVE
    assert default_priority(INTERACTIVE_MAX_TEXTS, INTERACTIVE_MAX_TOKENS) == INTERACTIVE
    assert default_priority(INTERACTIVE_MAX_TEXTS + 1, INTERACTIVE_MAX_TEXTS + 1) == BATCH
    assert default_priority(1, INTERACTIVE_MAX_TOKENS + 1) == BATCH


def blocked_endpoint():
    """An Endpoint whose single launch slot is held by a first batch until `engine.gate` opens."""
    engine = FakeEngine()
    engine.gate.clear()
    endpoint = Endpoint(make_service(engine, max_batch_tokens=8, max_batch_sequences=8))
    replies = Replies()
    encode(endpoint, replies, "first", [[1]])
    wait_until(lambda: len(engine.batches) == 1)
    return engine, endpoint, replies


def encode(endpoint, replies, name, seqs, options=RAW):
    endpoint.submit(RaggedTokens.from_rows(seqs, options=options), replies.callback(name))


def test_a_small_request_goes_ahead_of_a_large_one_queued_before_it():
    engine, endpoint, replies = blocked_endpoint()
    bulk = [[100 + i] for i in range(INTERACTIVE_MAX_TEXTS + 1)]  # default rule: batch
    encode(endpoint, replies, "bulk", bulk)
    encode(endpoint, replies, "query", [[7, 7]])                  # default rule: interactive
    engine.gate.set()
    replies.wait_for(3)
    assert engine.batches[1][0] == [7, 7]
    for name, seqs in (("bulk", bulk), ("query", [[7, 7]])):
        result, error = replies.results[name]
        assert error is None
        np.testing.assert_array_equal(result[EMBEDDINGS], [expected_row(s) for s in seqs])
    metrics = endpoint.service.metrics
    assert metrics.total("rose_priority_tokens_total", priority=BATCH) == len(bulk)
    assert metrics.total("rose_priority_tokens_total", priority=INTERACTIVE) == 1 + 2
    _, observations = metrics.drain()
    waits = {dict(labels)["priority"] for name, labels, _ in observations if name == "rose_wait_seconds"}
    assert waits == {INTERACTIVE, BATCH}
    endpoint.close()


def test_an_explicit_class_overrides_the_rule_and_one_class_is_fcfs():
    engine, endpoint, replies = blocked_endpoint()
    bulk = [[100 + i] for i in range(INTERACTIVE_MAX_TEXTS + 1)]
    encode(endpoint, replies, "bulk", bulk, RequestOptions(normalize=False, priority=INTERACTIVE))
    encode(endpoint, replies, "query", [[7, 7]])
    engine.gate.set()
    replies.wait_for(3)
    assert engine.batches[1][0] == [100]
    endpoint.close()


def test_queue_depth_by_class_is_a_labelled_gauge():
    engine, endpoint, replies = blocked_endpoint()
    encode(endpoint, replies, "bulk", [[5]] * 3, RequestOptions(normalize=False, priority=BATCH))
    encode(endpoint, replies, "query", [[6]])
    gauges = endpoint.gauges()
    assert gauges[("rose_queue_sequences", (("priority", BATCH),))] == 3
    assert gauges[("rose_queue_sequences", (("priority", INTERACTIVE),))] == 1
    engine.gate.set()
    replies.wait_for(3)
    endpoint.close()


def test_rows_do_not_depend_on_class_or_batch_mates(tmp_path):
    """batched == alone through the service: requests of both classes from several threads on a tiny
    real model; every row equals the sequence embedded alone."""
    from transformers import BertConfig, BertModel

    from engine_lib.contract import PackedBatch
    from engine_lib.runner.model_runner import ModelRunner
    from engine_lib.service.batching import BatchingService
    from testing.tiny_models import save_random_model

    save_random_model(BertModel, BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=64), tmp_path, seed=3)
    engine = ModelRunner(str(tmp_path), device="cpu")
    service = BatchingService(engine, max_batch_tokens=96, max_batch_sequences=16, cancel_check_interval=0,
                              batch_promote_s=0.001)
    rng = np.random.default_rng(4)
    work = [[[rng.integers(0, 128, size=int(n)) for n in rng.integers(1, 60, size=rng.integers(1, 6))]
             for _ in range(6)] for _ in range(4)]
    replies = Replies()

    def client(t):
        for r, seqs in enumerate(work[t]):
            service.submit(RaggedTokens.from_rows([list(s) for s in seqs]), replies.callback((t, r)),
                           priority=BATCH if (t + r) % 2 else INTERACTIVE)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    replies.wait_for(sum(map(len, work)))
    service.close()
    for t, requests in enumerate(work):
        for r, seqs in enumerate(requests):
            rows, error = replies.results[(t, r)]
            assert error is None
            alone = np.concatenate([engine.step(PackedBatch.from_sequences([s])).wait() for s in seqs])
            np.testing.assert_allclose(rows, alone, atol=1e-5, rtol=1e-4)

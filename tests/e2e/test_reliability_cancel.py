"""Cancellation on the real server. The encoder's test-only hold (testing/hold.py) keeps
requests queued, so a cancelled one is seen dropped before compute on any machine. Triton
2.51 hands a cancellation to a running decoupled model only on a direct call: an ensemble
checks for it between steps, so an ensemble request cancelled after reaching the encoder
is computed anyway (docs/operations.md)."""
from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from testing.embed_clients import embed_stream
from testing.hold import wait_for_metric, wait_for_metric_zero
from testing.metrics import sample, scrape
from testing.texts import LONG_TEXTS
from testing.waiting import wait_until


def counts(server, before):
    """(requests answered cancelled, sequences dropped) since `before`. (Requests answered ok
    are no signal here: the watchdog's probes add to them.)"""
    _, now = scrape(server)
    delta = lambda name, **labels: sample(now, name, **labels) - sample(before, name, **labels)
    return delta("rose_requests_total", outcome="cancelled"), delta("rose_cancelled_sequences_total")


def wait_for_cancelled(server, before, timeout=60):
    def cancelled():
        found = counts(server, before)
        return found if found[0] >= 1 else None

    return wait_until(cancelled, timeout, "a request answered cancelled", 0.1)


def send_on_stream(client, model, inputs):
    client.start_stream(callback=lambda result, error: None)
    client.async_stream_infer(model, inputs)


def test_cancelled_encoder_stream_drops_its_queued_sequences(server, model_dir):
    texts = [f"cancel me {i} " + LONG_TEXTS[i % 3] for i in range(24)]
    tokens = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions())
    input_ids, seq_lens = tokens.input_ids, tokens.seq_lens
    inputs = [grpcclient.InferInput("INPUT_IDS", [len(input_ids)], "INT64"),
              grpcclient.InferInput("SEQ_LENS", [len(seq_lens)], "INT64")]
    inputs[0].set_data_from_numpy(input_ids)
    inputs[1].set_data_from_numpy(seq_lens)
    _, before = scrape(server)
    with server.hold:  # queued until the cancellation is seen: none of it is computed
        wait_for_metric_zero(server.metrics_url, "rose_queue_tokens", why="(before the request)")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        send_on_stream(client, "rose_encoder", inputs)
        wait_for_metric(server.metrics_url, "rose_queue_tokens", len(input_ids), why="(the request never queued)")
        client.stop_stream(cancel_requests=True)
        client.close()
        cancelled, dropped = wait_for_cancelled(server, before)
    assert (cancelled, dropped) == (1, len(texts))  # none of it was computed
    assert embed_stream(server.grpc_url, ["still serving"]).shape == (1, 384)


def test_ensemble_cancelled_before_the_encoder_step_is_dropped(server):
    """Cancelled while the tokenizer holds it (its test-only hold), the request reaches the encoder
    marked cancelled and is dropped there (the encoder's hold keeps it queued until seen)."""
    texts = ["cancel me in the tokenizer", "and me"]
    text = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    _, before = scrape(server)
    with server.hold:
        with server.tokenizer_hold:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            send_on_stream(client, "ensemble", [text])
            server.tokenizer_hold.wait_entered()
            client.stop_stream(cancel_requests=True)
            client.close()
        cancelled, dropped = wait_for_cancelled(server, before)
    assert (cancelled, dropped) == (1, len(texts))
    assert embed_stream(server.grpc_url, ["still serving"]).shape == (1, 384)

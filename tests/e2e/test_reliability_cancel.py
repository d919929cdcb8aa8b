"""Cancellation on the real server. Requests wait behind a long "blocker"; a
cancelled one has its queued sequences dropped before compute. Triton 2.51
hands a cancellation to a running decoupled model only on a direct call: an
ensemble checks for it between steps, so an ensemble request cancelled after
reaching the encoder is computed anyway (docs/operations.md)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from testing.embed_clients import embed_stream
from testing.metrics import sample, scrape
from testing.texts import LONG_TEXTS


class Blocker:
    """~9k tokens x `scale` through the ensemble: seconds of work queued ahead of everything else."""

    def __init__(self, server, scale=1):
        self.server = server
        self.scale = scale
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        deadline = time.monotonic() + 30
        while sample(scrape(server)[1], "rose_queue_tokens") < 1:
            assert time.monotonic() < deadline, "the blocker never queued"
            time.sleep(0.05)

    def _run(self):
        embed_stream(self.server.grpc_url, [t + f" {i}" for i in range(12 * self.scale) for t in LONG_TEXTS],
                     timeout=300)
        self.done.set()

    def join(self):
        self.thread.join(300)


def cancellation_counts(server, before, expect_cancelled=1, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        _, now = scrape(server)
        cancelled = (sample(now, "rose_requests_total", outcome="cancelled")
                     - sample(before, "rose_requests_total", outcome="cancelled"))
        dropped = sample(now, "rose_cancelled_sequences_total") - sample(before, "rose_cancelled_sequences_total")
        if cancelled >= expect_cancelled or time.monotonic() > deadline:
            return cancelled, dropped
        time.sleep(0.2)


def send_on_stream(client, model, inputs):
    client.start_stream(callback=lambda result, error: None)
    client.async_stream_infer(model, inputs)


def cancel_behind_a_blocker(server, model, inputs, wait_before_cancel):
    """Send `inputs` on a stream behind a blocker and cancel it while the blocker still runs.

    The blocker doubles until it outlasts the cancellation, so a faster machine
    needs more attempts, never a skip. Returns the metrics sample from before."""
    for scale in (1, 2, 4, 8):
        _, before = scrape(server)
        blocker = Blocker(server, scale)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        send_on_stream(client, model, inputs)
        time.sleep(wait_before_cancel)
        client.stop_stream(cancel_requests=True)
        client.close()
        cancelled_while_blocked = not blocker.done.is_set()
        blocker.join()
        if cancelled_while_blocked:
            return before
    pytest.fail("the blocker finished before the cancellation even at 8x its size")


def test_cancelled_encoder_stream_drops_its_queued_sequences(server, model_dir):
    texts = [f"cancel me {i} " + LONG_TEXTS[i % 3] for i in range(24)]
    input_ids, seq_lens = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions())
    inputs = [grpcclient.InferInput("INPUT_IDS", [len(input_ids)], "INT64"),
              grpcclient.InferInput("SEQ_LENS", [len(seq_lens)], "INT64")]
    inputs[0].set_data_from_numpy(input_ids)
    inputs[1].set_data_from_numpy(seq_lens)
    before = cancel_behind_a_blocker(server, "rose_encoder", inputs, wait_before_cancel=0.5)
    cancelled, dropped = cancellation_counts(server, before)
    assert cancelled == 1 and 1 <= dropped <= len(texts), (cancelled, dropped)
    assert embed_stream(server.grpc_url, ["still serving"]).shape == (1, 384)


def test_ensemble_cancelled_before_the_encoder_step_is_dropped(server):
    slow_texts = ["x" * (512 << 10)] * 2  # about a second in the tokenizer: cancel lands there
    text = grpcclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in slow_texts], dtype=object))
    before = cancel_behind_a_blocker(server, "ensemble", [text], wait_before_cancel=0.2)
    cancelled, dropped = cancellation_counts(server, before)
    assert (cancelled, dropped) == (1, 2)

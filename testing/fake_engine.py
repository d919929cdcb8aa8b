"""A deterministic stand-in for the engine (implements engine_lib.contract.Engine)
and helpers to drive an BatchingService with it, shared by the service and encoder tests."""
from __future__ import annotations

import threading

import numpy as np

from engine_lib.contract import RaggedTokens
from engine_lib.service.batching import BatchingService


class GatedResult:
    def __init__(self, rows, gate, error=None):
        self._rows, self._gate, self._error = rows, gate, error

    def ready(self):
        return self._gate.is_set() and self._error is None

    def wait(self):
        assert self._gate.wait(10), "test gate never opened"
        if self._error:
            raise self._error
        return self._rows


class FakeEngine:
    """Row for a sequence: [first id, length, sum of ids, 0]; results wait for `gate`."""
    hidden_size = output_dim = 4
    type_vocab_size = 2
    task = "embed"
    vocab_size = 1000
    max_positions = 64

    def __init__(self, fail_token: int | None = None, short_token: int | None = None):
        """A batch holding `fail_token` fails its step; one holding `short_token` returns a row too few."""
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[list[list[int]]] = []
        self.fail_token = fail_token
        self.short_token = short_token

    def step(self, batch):
        seqs = [batch.input_ids[a:b].tolist() for a, b in zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:])]
        self.batches.append(seqs)
        if self.fail_token is not None and self.fail_token in batch.input_ids:
            raise RuntimeError("poisoned batch")
        rows = np.array([expected_row(s) for s in seqs], dtype=np.float32)
        if self.short_token is not None and self.short_token in batch.input_ids:
            rows = rows[:-1]
        return GatedResult(rows, self.gate)


def expected_row(ids) -> list[float]:
    return [ids[0], len(ids), sum(ids), 0]


class Replies:
    """Collects on_done calls; fails the test on a second answer to one request."""

    def __init__(self):
        self.results: dict[str, tuple] = {}
        self.done = threading.Condition()

    def callback(self, name):
        def on_done(rows, error):
            with self.done:
                assert name not in self.results, f"{name} answered twice"
                self.results[name] = (rows, error)
                self.done.notify_all()
        return on_done

    def wait_for(self, count, timeout=60):
        with self.done:
            assert self.done.wait_for(lambda: len(self.results) >= count, timeout), \
                f"only {len(self.results)} of {count} answered"


def submit(service, replies, name, seqs, token_types=None, **kwargs):
    """One request of validated sequences straight to the service (raw rows back);
    `token_types`: segment ids per sequence, as `seqs`."""
    tokens = RaggedTokens.from_rows([list(s) for s in seqs], None if token_types is None else [list(t) for t in token_types])
    return service.submit(tokens, replies.callback(name), **kwargs)


def make_service(engine, **kwargs):
    args = dict(max_batch_tokens=32, max_batch_sequences=4, max_inflight_batches=1, cancel_check_interval=0)
    return BatchingService(engine, **{**args, **kwargs})


class FakeCapture:
    """Stands in for CUDA graph capture: replay re-runs the step over the static buffers."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    def __call__(self, fn):
        self.calls += 1
        if self.fail:
            raise RuntimeError("capture failed")
        output = fn()
        return (lambda: output.copy_(fn())), output

"""EncoderService with a fake engine (no torch model, no Triton): admission
control, cancellation, failure isolation, exactly-once answers."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from engine_lib.errors import InputError, OverloadError, RequestCancelled
from engine_lib.options import RequestOptions
from engine_lib.serving import EncoderService

RAW = RequestOptions(normalize=False)


class GatedResult:
    def __init__(self, rows, gate, error=None):
        self._rows, self._gate, self._error = rows, gate, error

    def ready(self):
        return self._gate.is_set()

    def wait(self):
        assert self._gate.wait(10), "test gate never opened"
        if self._error:
            raise self._error
        return self._rows


class FakeEngine:
    """Row for a sequence: [first id, length, sum of ids, 0]; results wait for `gate`."""
    hidden_size = 4
    vocab_size = 1000
    max_positions = 64

    def __init__(self, fail_token: int | None = None):
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[list[list[int]]] = []
        self.fail_token = fail_token

    def step(self, batch):
        seqs = [batch.input_ids[a:b].tolist() for a, b in zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:])]
        self.batches.append(seqs)
        if self.fail_token is not None and self.fail_token in batch.input_ids:
            raise RuntimeError("poisoned batch")
        return GatedResult(np.array([expected_row(s) for s in seqs], dtype=np.float32), self.gate)


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

    def wait_for(self, count, timeout=10):
        with self.done:
            assert self.done.wait_for(lambda: len(self.results) >= count, timeout), \
                f"only {len(self.results)} of {count} answered"


def submit(service, replies, name, seqs, options=RAW, **kwargs):
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    return service.submit(ids, lens, options, replies.callback(name), **kwargs)


def make_service(engine, **kwargs):
    args = dict(max_batch_tokens=32, max_batch_sequences=4, max_inflight_batches=1, cancel_check_interval=0)
    return EncoderService(engine, **{**args, **kwargs})


def wait_until(predicate, timeout=5):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def random_request(rng, max_seqs=6):
    return [[rng.randrange(1, 1000) for _ in range(rng.randrange(1, 40))] for _ in range(rng.randrange(1, max_seqs))]


def test_every_request_gets_its_own_rows_exactly_once():
    rng = random.Random(0)
    service = make_service(FakeEngine(), max_inflight_batches=2)
    replies, requests = Replies(), {}

    def client(worker):
        for i in range(40):
            name = f"{worker}-{i}"
            requests[name] = random_request(rng)
            submit(service, replies, name, requests[name])

    threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    replies.wait_for(len(requests))
    for name, seqs in requests.items():
        rows, error = replies.results[name]
        assert error is None
        np.testing.assert_array_equal(rows, [expected_row(s) for s in seqs])
    service.close()
    assert service.metrics.total("rose_requests_total", outcome="ok") == len(requests)


def test_refuses_past_queued_tokens_at_once_and_accepted_ones_complete():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine, max_queued_tokens=100)
    replies, accepted, refusals = Replies(), {}, []
    for i in range(30):
        seqs = [[i + 1] * 10]
        started = time.perf_counter()
        try:
            submit(service, replies, i, seqs)
            accepted[i] = seqs
        except OverloadError as exc:
            refusals.append((time.perf_counter() - started, str(exc)))
    # 10 queued + at most one batch held by the scheduler + one in flight.
    assert 10 <= len(accepted) <= 18
    assert len(refusals) == 30 - len(accepted)
    assert max(seconds for seconds, _ in refusals) < 0.05
    assert "max_queued_tokens=100" in refusals[0][1]
    assert service.metrics.total("rose_refused_total", reason="queue_tokens") == len(refusals)
    engine.gate.set()
    replies.wait_for(len(accepted))
    for i, seqs in accepted.items():
        np.testing.assert_array_equal(replies.results[i][0], [expected_row(s) for s in seqs])
    service.close()


def test_refuses_past_queued_requests():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine, max_queued_requests=5)
    replies = Replies()
    for i in range(5):
        submit(service, replies, i, [[i + 1]])
    with pytest.raises(OverloadError, match="max_queued_requests=5"):
        submit(service, replies, "extra", [[7]])
    assert service.queue_depth()["rose_queue_requests"] == 5
    engine.gate.set()
    replies.wait_for(5)
    submit(service, replies, "later", [[7]])  # room again once answered
    replies.wait_for(6)
    service.close()


def test_request_larger_than_the_queue_is_invalid_not_overload():
    service = make_service(FakeEngine(), max_queued_tokens=50)
    with pytest.raises(InputError, match="split it"):
        submit(service, Replies(), "big", [[1] * 30, [2] * 30])
    service.close()


@pytest.mark.parametrize("ids, lens, message", [
    ([1, 2], [3], "sums to 3"),
    ([1, 2], [2, 0], "needs >= 1 token"),
    ([1, 1000], [2], "outside"),
    ([-1], [1], "outside"),
    ([1] * 65, [65], "at most 64"),
    ([], [], "empty"),
])
def test_invalid_requests_are_refused_before_queuing(ids, lens, message):
    service = make_service(FakeEngine())
    with pytest.raises(InputError, match=message):
        service.submit(np.array(ids, dtype=np.int64), np.array(lens, dtype=np.int64), RAW, lambda *a: None)
    assert service.queue_depth() == {"rose_queue_requests": 0, "rose_queue_tokens": 0}
    service.close()


def test_cancelled_request_is_dropped_before_compute():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine)
    replies, cancelled = Replies(), threading.Event()
    submit(service, replies, "first", [[1] * 30])       # launched; blocks the single slot
    wait_until(lambda: len(engine.batches) == 1)
    submit(service, replies, "gone", [[2] * 30, [3] * 30], is_cancelled=cancelled.is_set)
    submit(service, replies, "after", [[4] * 5])
    cancelled.set()
    engine.gate.set()
    replies.wait_for(3)
    assert isinstance(replies.results["gone"][1], RequestCancelled)
    assert replies.results["after"][1] is None
    computed = {seq[0] for batch in engine.batches for seq in batch}
    assert computed == {1, 4}
    assert service.metrics.total("rose_cancelled_sequences_total") == 2
    assert service.metrics.total("rose_requests_total", outcome="cancelled") == 1
    service.close()


def test_cancellation_mid_request_drops_the_rest():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine, max_batch_sequences=2)
    replies, cancelled = Replies(), threading.Event()
    submit(service, replies, "long", [[i + 1] * 3 for i in range(8)], is_cancelled=cancelled.is_set)
    wait_until(lambda: len(engine.batches) == 1)   # two sequences launched
    cancelled.set()
    engine.gate.set()
    replies.wait_for(1)
    assert isinstance(replies.results["long"][1], RequestCancelled)
    assert sum(len(b) for b in engine.batches) <= 4  # at most one more batch slipped in before the check
    assert service.queue_depth()["rose_queue_tokens"] == 0
    service.close()


def test_requests_younger_than_the_check_interval_are_not_checked():
    service = make_service(FakeEngine(), cancel_check_interval=60)
    replies, checks = Replies(), []
    submit(service, replies, "r", [[5, 6]], is_cancelled=lambda: checks.append(1) or True)
    replies.wait_for(1)
    assert replies.results["r"][1] is None and not checks
    service.close()


def test_broken_cancellation_check_keeps_serving():
    service = make_service(FakeEngine())
    replies = Replies()

    def broken():
        raise OSError("stub pipe closed")

    submit(service, replies, "r", [[5, 6]], is_cancelled=broken)
    replies.wait_for(1)
    assert replies.results["r"][1] is None
    service.close()


def test_engine_failure_fails_only_its_requests():
    engine = FakeEngine(fail_token=999)
    service = make_service(engine, max_batch_sequences=1)
    replies = Replies()
    submit(service, replies, "bad", [[999, 1]])
    submit(service, replies, "good", [[5, 6]])
    replies.wait_for(2)
    assert "inference failed" in str(replies.results["bad"][1])
    np.testing.assert_array_equal(replies.results["good"][0], [expected_row([5, 6])])
    submit(service, replies, "later", [[7]])
    replies.wait_for(3)
    assert replies.results["later"][1] is None
    service.close()


def test_close_drains_then_refuses():
    engine = FakeEngine()
    service = make_service(engine)
    replies = Replies()
    for i in range(10):
        submit(service, replies, i, [[i + 1] * 7])
    service.close()
    assert len(replies.results) == 10 and all(e is None for _, e in replies.results.values())
    with pytest.raises(OverloadError, match="shutting down"):
        submit(service, replies, "late", [[1]])
    assert service.metrics.total("rose_refused_total", reason="shutting_down") == 1


def test_options_apply_per_request():
    service = make_service(FakeEngine())
    replies = Replies()
    submit(service, replies, "cut", [[3, 4]], RequestOptions(normalize=False, dimensions=2))
    submit(service, replies, "unit", [[3, 4]], RequestOptions(normalize=True))
    replies.wait_for(2)
    np.testing.assert_array_equal(replies.results["cut"][0], [[3, 2]])
    np.testing.assert_allclose(np.linalg.norm(replies.results["unit"][0], axis=1), 1, rtol=1e-6)
    with pytest.raises(InputError, match="dimensions"):
        submit(service, replies, "wide", [[1]], RequestOptions(dimensions=5))
    service.close()


def test_error_messages_carry_their_code():
    from engine_lib.errors import client_message, code_name, code_name_from_message

    for error, name in ((InputError("x"), "INVALID_ARG"), (OverloadError("x"), "UNAVAILABLE"),
                        (RequestCancelled("x"), "CANCELLED"), (RuntimeError("x"), "INTERNAL")):
        assert code_name(error) == name
        wrapped = f"in ensemble 'ensemble', {client_message(error)}"
        assert code_name_from_message(wrapped) == (None if name == "INTERNAL" else name)
    assert code_name_from_message("Exceeds maximum queue size") == "UNAVAILABLE"

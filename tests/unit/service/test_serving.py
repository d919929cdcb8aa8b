"""BatchingService with a fake engine (no torch model, no Triton): batch limits,
admission control, cancellation, failure isolation, in-flight overlap,
draining, exactly-once answers."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from engine_lib.contract import RaggedTokens
from engine_lib.errors import OverloadError, RequestCancelled
from engine_lib.service.metrics import HOPS
from testing.fake_engine import FakeEngine, Replies, expected_row, make_service, submit
from testing.waiting import wait_until


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

    threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(4)]
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


def test_batches_respect_the_token_budget_and_sequence_cap():
    engine = FakeEngine()
    engine.gate.clear()  # requests pile up while the first batch runs
    service = make_service(engine, max_batch_tokens=20, max_batch_sequences=3)
    rng = random.Random(1)
    replies, requests = Replies(), {i: random_request(rng) for i in range(30)}
    for name, seqs in requests.items():
        submit(service, replies, name, seqs)
    engine.gate.set()
    replies.wait_for(len(requests))
    service.close()
    assert all(sum(map(len, batch)) <= 20 or len(batch) == 1 for batch in engine.batches)
    assert all(len(batch) <= 3 for batch in engine.batches)
    assert any(len(batch) > 1 for batch in engine.batches)


def test_refuses_past_queued_tokens_at_once_and_accepted_ones_complete():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine, max_queued_tokens=100)
    replies, accepted, refusals = Replies(), {}, []
    for i in range(30):
        seqs = [[i + 1] * 10]
        try:
            submit(service, replies, i, seqs)
            accepted[i] = seqs
        except OverloadError as exc:  # raised by submit itself: nothing waits for the queue
            refusals.append(str(exc))
    # 10 queued + at most one batch held by the scheduler + one in flight.
    assert 10 <= len(accepted) <= 18
    assert len(refusals) == 30 - len(accepted)
    assert "max_queued_tokens=100" in refusals[0]
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


class OutOfMemoryEngine(FakeEngine):
    """A step holding `token` fails as torch's CUDA allocator fails (its own exception type)."""

    def __init__(self, token: int):
        super().__init__()
        self.token = token

    def step(self, batch):
        import torch  # only this test needs torch's exception type

        if self.token in batch.input_ids:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.34 GiB. GPU 0 has a total "
                                         "capacity of 139.80 GiB of which 1.62 GiB is free.")
        return super().step(batch)


def test_a_step_out_of_device_memory_is_refused_as_overload_naming_the_batch_and_the_service_goes_on():
    service = make_service(OutOfMemoryEngine(token=999), max_batch_sequences=1)
    replies = Replies()
    submit(service, replies, "big", [[999, 1, 2]])
    submit(service, replies, "good", [[5, 6]])
    replies.wait_for(2)
    error = replies.results["big"][1]
    assert isinstance(error, OverloadError)
    assert "ran out of memory on a batch of 3 tokens in 1 sequence;" in str(error)
    assert f"max_batch_tokens={service.max_batch_tokens}" in str(error)
    np.testing.assert_array_equal(replies.results["good"][0], [expected_row([5, 6])])
    submit(service, replies, "later", [[7]])
    replies.wait_for(3)
    assert replies.results["later"][1] is None
    service.close()


@pytest.mark.parametrize("handed_off", [False, True], ids=["answered-inline", "completion-thread"])
def test_rows_not_matching_the_batch_fail_its_requests_with_an_error(handed_off):
    engine = FakeEngine(short_token=999)  # a batch holding 999 returns one row too few
    if handed_off:
        engine.gate.clear()
    service = make_service(engine, max_batch_sequences=2)
    replies = Replies()
    submit(service, replies, "short", [[999, 1], [2]])  # fills one batch of two sequences
    submit(service, replies, "good", [[5, 6]])
    if handed_off:  # the scheduler found the batch not ready and handed it over
        wait_until(lambda: service._handed_off >= 1)
    engine.gate.set()
    replies.wait_for(2)
    rows, error = replies.results["short"]
    assert rows is None and "returned rows of shape [1, 4] for 2 sequences" in str(error)
    np.testing.assert_array_equal(replies.results["good"][0], [expected_row([5, 6])])
    service.close()
    assert service.metrics.total("rose_requests_total", outcome="error") == 1


def test_a_response_callback_that_fails_on_the_result_is_answered_with_the_error():
    service = make_service(FakeEngine())
    calls, answered = [], threading.Event()

    def on_done(rows, error):
        calls.append((rows, error))
        if error is None:
            raise RuntimeError("cannot build the response")
        answered.set()

    service.submit(RaggedTokens.from_rows([[1, 2]]), on_done)
    assert answered.wait(10), f"the request got no error answer after its callback failed: {calls}"
    replies = Replies()
    submit(service, replies, "next", [[3]])  # the service goes on
    replies.wait_for(1)
    service.close()
    assert [rows is None for rows, _ in calls] == [False, True]
    assert "sending the result failed" in str(calls[1][1]) and "cannot build the response" in str(calls[1][1])
    assert service.metrics.total("rose_requests_total", outcome="error") == 1
    assert service.metrics.total("rose_requests_total", outcome="ok") == 1  # only "next"


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


def test_hops_of_an_answered_request_cover_its_time_inside_in_order():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine)
    replies = Replies()
    received = time.perf_counter()
    submit(service, replies, "r", [[5, 6], [7]], received_at=received)
    wait_until(lambda: len(engine.batches) == 1)
    time.sleep(0.05)
    engine.gate.set()
    replies.wait_for(1)
    service.close()  # joins the threads: every hop is recorded
    answered = time.perf_counter()
    hops = {h: service.metrics.total("rose_hop_seconds_total", hop=h) for h in HOPS}
    assert all(v >= 0 for v in hops.values()), hops
    assert hops["compute"] >= 0.05 and sum(hops.values()) <= answered - received


def test_hops_are_not_recorded_for_failed_requests():
    service = make_service(FakeEngine(fail_token=999))
    replies = Replies()
    submit(service, replies, "bad", [[999, 1]])
    replies.wait_for(1)
    service.close()
    assert all(service.metrics.total("rose_hop_seconds_total", hop=h) == 0 for h in HOPS)


def test_requests_arriving_while_every_slot_is_busy_form_one_batch():
    engine = FakeEngine()
    engine.gate.clear()
    service = make_service(engine, max_inflight_batches=1)
    replies = Replies()
    submit(service, replies, "first", [[1, 2]])
    wait_until(lambda: len(engine.batches) == 1)   # launched; holds the only slot
    for i in range(3):
        submit(service, replies, i, [[10 + i]])
        time.sleep(0.02)                           # the scheduler had every chance to freeze a batch early
    engine.gate.set()
    replies.wait_for(4)
    assert engine.batches[1] == [[10], [11], [12]]
    service.close()


def test_ready_results_are_answered_without_a_hand_off_and_pending_ones_by_the_completion_thread():
    engine = FakeEngine()
    service = make_service(engine)
    threads = {}

    def on_done(name):
        return lambda rows, error: threads.setdefault(name, threading.current_thread().name)

    service.submit(RaggedTokens.from_rows([[1, 2]]), on_done("ready"))
    wait_until(lambda: "ready" in threads)
    engine.gate.clear()
    service.submit(RaggedTokens.from_rows([[3]]), on_done("pending"))
    wait_until(lambda: service._handed_off == 1)  # not ready at launch: handed over, not answered inline
    engine.gate.set()
    wait_until(lambda: "pending" in threads)
    service.close()
    assert threads == {"ready": "rose-scheduler", "pending": "rose-completion"}

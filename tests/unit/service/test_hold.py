"""The test-only hold of BatchingService (engine_lib/faults.py, point ENCODER_BATCH, here
through the file gate a server installs): while held no batch is picked; queued requests
are still checked for cancellation (at launch a request is checked once: more checks prove
the hold); closing ends the hold."""
from __future__ import annotations

import pytest

from engine_lib import faults
from engine_lib.errors import RequestCancelled
from rose_triton.faults import gate_file
from testing.fake_engine import FakeEngine, Replies, make_service, submit
from testing.hold import held_in_process
from testing.waiting import wait_until


@pytest.fixture
def hold(tmp_path):
    """The encoder's gate file, held (it exists) as each test starts."""
    with held_in_process(tmp_path):
        path = gate_file(tmp_path, faults.ENCODER_BATCH)
        path.touch()
        yield path


class Checks:
    """An is_cancelled that counts its calls and says True once told to."""

    def __init__(self):
        self.calls, self.cancelled = 0, False

    def __call__(self):
        self.calls += 1
        return self.cancelled


def test_a_held_batch_waits_for_the_file_to_go_then_runs(hold):
    engine = FakeEngine()
    service = make_service(engine)
    replies, checks = Replies(), Checks()
    submit(service, replies, "held", [[5, 6], [7]], is_cancelled=checks)
    wait_until(lambda: checks.calls >= 3)
    assert engine.batches == [] and replies.results == {}
    assert service.queue_depth() == {"rose_queue_requests": 1, "rose_queue_tokens": 3}
    hold.unlink()
    replies.wait_for(1)
    assert engine.batches == [[[5, 6], [7]]] and replies.results["held"][1] is None
    submit(service, replies, "after", [[9]])  # no file: no hold
    replies.wait_for(2)
    service.close()


def test_a_request_cancelled_while_held_is_answered_without_a_step(hold):
    engine = FakeEngine()
    service = make_service(engine)
    replies, checks = Replies(), Checks()
    submit(service, replies, "gone", [[1, 2], [3]], is_cancelled=checks)
    wait_until(lambda: checks.calls >= 3)
    checks.cancelled = True
    replies.wait_for(1)  # while the file still exists
    assert isinstance(replies.results["gone"][1], RequestCancelled) and engine.batches == []
    assert service.queue_depth() == {"rose_queue_requests": 0, "rose_queue_tokens": 0}
    assert service.metrics.total("rose_cancelled_sequences_total") == 2
    hold.unlink()
    service.close()


def test_closing_ends_the_hold_and_drains(hold):
    engine = FakeEngine()
    service = make_service(engine)
    replies, checks = Replies(), Checks()
    submit(service, replies, "held", [[4]], is_cancelled=checks)
    wait_until(lambda: checks.calls >= 3)
    service.close(timeout=10)
    assert replies.results["held"][1] is None and engine.batches == [[[4]]]
    assert hold.exists()

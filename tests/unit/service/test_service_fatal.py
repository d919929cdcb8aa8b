"""BatchingService fails loudly when a service thread dies or the device reports a sticky error:
pending requests answered with an error, new ones refused, `on_fatal` called once (the default
exits the process so the launcher's watchdog restarts the server)."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from engine_lib.errors import OverloadError
from testing import REPO
from testing.fake_engine import FakeEngine, Replies, make_service, submit


class FatalRecorder:
    def __init__(self):
        self.reasons: list[str] = []
        self.called = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.called.set()


def assert_failed_for_good(service, fatal, replies, pending: int, reason_part: str):
    assert fatal.called.wait(5) and len(fatal.reasons) == 1 and reason_part in fatal.reasons[0]
    replies.wait_for(pending)
    assert all(rows is None and "restarting" in str(error) for rows, error in replies.results.values())
    with pytest.raises(OverloadError, match="has failed"):
        submit(service, replies, "late", [[1, 2]])


def test_scheduler_thread_death_fails_pending_requests_and_calls_on_fatal():
    engine, fatal = FakeEngine(), FatalRecorder()
    engine.gate.clear()
    service = make_service(engine, on_fatal=fatal)
    popped, next_batch = threading.Event(), service._batcher.next_batch

    def first_then_broken():
        if popped.is_set():
            raise RuntimeError("injected scheduler bug")
        batch = next_batch()
        popped.set()
        return batch

    service._batcher.next_batch = first_then_broken
    submit(service, Replies(), "warm", [[1]])
    assert popped.wait(5)  # the scheduler holds "warm": it waits for the launch slot until the gate opens
    replies = Replies()
    for i in range(3):
        submit(service, replies, i, [[5, 6, 7]])
    engine.gate.set()
    assert_failed_for_good(service, fatal, replies, 3, "rose-scheduler thread died")


def test_completion_thread_death_fails_pending_requests_and_calls_on_fatal():
    engine, fatal = FakeEngine(), FatalRecorder()
    engine.gate.clear()
    service = make_service(engine, on_fatal=fatal)

    def broken_observe(*args, **kwargs):
        raise RuntimeError("injected completion bug")

    service.metrics.observe = broken_observe  # the completion thread records each step
    replies = Replies()
    for i in range(4):
        submit(service, replies, i, [[3, 4]])
    engine.gate.set()
    # The completion path runs on the completion thread (pending results) or, for a result
    # ready at launch, on the scheduler thread: whichever hits the bug first fails the service.
    assert_failed_for_good(service, fatal, replies, 4, "thread died: RuntimeError('injected completion bug')")


class StickyEngine(FakeEngine):
    """Token 13 gives a sticky device error, once `release` is set (so that later requests are queued)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def step(self, batch):
        if 13 in batch.input_ids:
            assert self.release.wait(10), "test never released the sticky step"
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().step(batch)


def test_sticky_device_error_is_fatal_but_an_ordinary_step_error_is_not():
    fatal = FatalRecorder()
    service = make_service(FakeEngine(fail_token=99), on_fatal=fatal, max_batch_sequences=1)
    replies = Replies()
    submit(service, replies, "poisoned", [[99]])
    submit(service, replies, "fine", [[1, 2]])
    replies.wait_for(2)
    assert replies.results["fine"][1] is None and not fatal.called.is_set()  # one bad batch only

    engine = StickyEngine()
    service = make_service(engine, on_fatal=fatal, max_batch_sequences=1)
    replies = Replies()
    for name, seqs in (("sticky", [[13]]), ("after", [[1, 2]])):
        submit(service, replies, name, seqs)
    engine.release.set()
    assert fatal.called.wait(5) and "illegal memory access" in fatal.reasons[0]
    replies.wait_for(2)
    assert all(error is not None for _, error in replies.results.values())


def test_default_on_fatal_exits_the_process():
    code = """
import time
from testing.fake_engine import FakeEngine, Replies, make_service, submit
from engine_lib.service.fatal import EXIT_CODE
service = make_service(FakeEngine())
def broken():
    raise RuntimeError("injected")
service._batcher.next_batch = broken
submit(service, Replies(), "x", [[1]])
time.sleep(10)
print("still alive")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=REPO)  # imports testing/ and engine_lib/ from the checkout
    from engine_lib.service.fatal import EXIT_CODE

    assert run.returncode == EXIT_CODE and "still alive" not in run.stdout, run.stderr[-2000:]
    assert "encoder failed: rose-scheduler thread died" in run.stderr


@pytest.mark.gpu
def test_gpu_device_side_assert_in_a_step_ends_the_process_with_the_exit_code(tmp_path):
    """A real device-side assert (an out-of-range index on the GPU, raised when the result is
    waited for) is sticky: the service answers the request with an error and the process ends
    with EXIT_CODE, which the launcher restarts on."""
    code = f"""
import threading, torch
from transformers import BertConfig, BertModel
from engine_lib.runner.model_runner import ModelRunner
from testing.fake_engine import Replies, make_service, submit
from testing.tiny_models import save_random_model
save_random_model(BertModel, BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2), {str(tmp_path)!r}, seed=1)
runner = ModelRunner({str(tmp_path)!r}, device="cuda", dtype="float32", cuda_graphs="off", self_check=False)
forward = runner.forward_eager
def poisoned(batch):
    small = torch.zeros(2, device=runner.device)
    small[torch.tensor([7], device=runner.device)] += 1  # device-side assert: index out of bounds
    return forward(batch)
runner.forward_eager = poisoned
replies = Replies()
submit(make_service(runner), replies, "poisoned", [[1, 2, 3]])
replies.wait_for(1)
print("answered:", replies.results["poisoned"][1], flush=True)
threading.Event().wait()  # the fatal path ends the process; subprocess.run's timeout bounds a hang
print("still alive", flush=True)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    from engine_lib.service.fatal import EXIT_CODE

    assert run.returncode == EXIT_CODE and "still alive" not in run.stdout, run.stderr[-3000:]
    assert "answered:" in run.stdout and "device-side assert" in run.stdout + run.stderr

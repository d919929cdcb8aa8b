"""TokenizeLane: requests queued while the lane works go together in one `many` call; each gets
exactly its own answer; a full queue refuses at once; close answers what waits."""
from __future__ import annotations

import threading

import pytest

from engine_lib.errors import InputError, OverloadError
from engine_lib.tokenization.lane import TokenizeLane


class Step:
    """A `many` the test holds: the lane's first group blocks until `gate` is set."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()
        self.groups: list[list] = []

    def many(self, requests):
        self.groups.append([tensors for tensors, _ in requests])
        self.entered.set()
        assert self.gate.wait(30)
        return [InputError(f"bad {t}", "TEXT") if str(t).startswith("bad") else {"ids": t} for t, _ in requests]


class Answers:
    def __init__(self, count):
        self.got, self.count = {}, count
        self.cond = threading.Condition()

    def __call__(self, reply, result):
        with self.cond:
            assert reply not in self.got, f"{reply} answered twice"
            self.got[reply] = result
            self.cond.notify_all()

    def wait(self, count=None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.got) >= (count or self.count), 30)


def test_requests_that_wait_go_together_and_each_gets_its_own_answer():
    step, answers = Step(), Answers(6)
    lane = TokenizeLane(step.many, answers)
    lane.submit("first", None, "r0")
    assert step.entered.wait(30)  # the lane is busy with the first request
    for i, tensors in enumerate(["a", "bad b", "c", "d", "e"], start=1):
        lane.submit(tensors, None, f"r{i}")
    step.gate.set()
    assert answers.wait()
    assert step.groups == [["first"], ["a", "bad b", "c", "d", "e"]]
    assert answers.got["r0"] == {"ids": "first"} and answers.got["r3"] == {"ids": "c"}
    assert isinstance(answers.got["r2"], InputError) and "bad b" in str(answers.got["r2"])
    lane.close()


def test_a_full_queue_refuses_at_once_and_takes_work_again_once_drained():
    step, answers = Step(), Answers(4)
    lane = TokenizeLane(step.many, answers, max_waiting_requests=2)
    lane.submit("first", None, "r0")
    assert step.entered.wait(30)
    lane.submit("a", None, "r1")
    lane.submit("b", None, "r2")
    with pytest.raises(OverloadError, match="max_waiting_requests=2"):
        lane.submit("c", None, "refused")
    step.gate.set()
    assert answers.wait(3)
    lane.submit("later", None, "r3")  # room again
    assert answers.wait() and "refused" not in answers.got
    lane.close()


def test_a_failing_group_answers_every_request_with_the_error():
    answers = Answers(3)

    def broken(requests):
        raise ValueError("tokenizer blew up")

    lane = TokenizeLane(broken, answers)
    for i in range(3):
        lane.submit(i, None, f"r{i}")
    assert answers.wait()
    assert all("tokenizer blew up" in str(e) for e in answers.got.values())
    lane.close()


def test_close_answers_what_waits_then_refuses():
    step, answers = Step(), Answers(3)
    lane = TokenizeLane(step.many, answers)
    lane.submit("first", None, "r0")
    assert step.entered.wait(30)
    lane.submit("a", None, "r1")
    lane.submit("b", None, "r2")
    closer = threading.Thread(target=lane.close)
    closer.start()
    step.gate.set()
    closer.join(30)
    assert set(answers.got) == {"r0", "r1", "r2"}
    with pytest.raises(OverloadError, match="shutting down"):
        lane.submit("late", None, "r3")

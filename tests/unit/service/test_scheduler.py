"""PriorityBatcher: FCFS order within a class, interactive before batch, promotion of waiting batch work,
budget and cap, long sequences alone, no starvation (time from a fake clock: no sleeps)."""
import random

import pytest

from engine_lib.service.scheduler import (BATCH, CPU_BACKFILL_TOKENS, CPU_BATCH_CLASS_TOKENS, INTERACTIVE, PRIORITIES,
                                          PriorityBatcher, backfill_budget, batch_class_budget)


def drain(batcher):
    batches = []
    while len(batcher):
        batches.append(batcher.next_batch())
    return batches


def test_fcfs_order_across_requests():
    batcher = PriorityBatcher(max_batch_tokens=10, max_batch_sequences=100)
    batcher.add("a", [3, 3])
    batcher.add("b", [2])
    batcher.add("c", [4, 1])
    flat = [(s.request_key, s.index) for batch in drain(batcher) for s in batch]
    assert flat == [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]


def test_budget_and_cap_respected():
    rng = random.Random(0)
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=5)
    for r in range(50):
        batcher.add(r, [rng.randint(1, 40) for _ in range(rng.randint(1, 8))])
    for batch in drain(batcher):
        assert 1 <= len(batch) <= 5
        assert sum(s.num_tokens for s in batch) <= 64


def test_batch_is_maximal_fcfs_prefix():
    batcher = PriorityBatcher(max_batch_tokens=10, max_batch_sequences=100)
    batcher.add("a", [4, 4, 4, 1])
    first = batcher.next_batch()
    # The third sequence (4) would exceed 10; the 1 behind it must not jump the queue.
    assert [s.num_tokens for s in first] == [4, 4]
    assert [s.num_tokens for s in batcher.next_batch()] == [4, 1]


def test_long_sequence_goes_alone():
    batcher = PriorityBatcher(max_batch_tokens=16, max_batch_sequences=8)
    batcher.add("short", [2])
    batcher.add("long", [100])
    batcher.add("after", [3])
    batches = drain(batcher)
    assert [[s.num_tokens for s in b] for b in batches] == [[2], [100], [3]]


def test_no_request_starves_under_continuous_arrivals():
    batcher = PriorityBatcher(max_batch_tokens=32, max_batch_sequences=4)
    batcher.add("victim", [30])
    served_at = None
    for step in range(20):
        batcher.add(f"small{step}", [1, 1])  # a stream of small work keeps arriving
        if any(s.request_key == "victim" for s in batcher.next_batch()):
            served_at = step
            break
    assert served_at == 0


def test_queued_tokens_and_drop():
    batcher = PriorityBatcher(max_batch_tokens=100, max_batch_sequences=100)
    batcher.add("a", [5, 5])
    batcher.add("b", [7])
    assert batcher.queued_tokens == 17
    assert batcher.drop("a") == 2
    assert batcher.queued_tokens == 7
    assert [s.request_key for s in batcher.next_batch()] == ["b"]
    assert batcher.queued_tokens == 0


def test_invalid_input_refused():
    with pytest.raises(ValueError):
        PriorityBatcher(0, 1)
    batcher = PriorityBatcher(10, 10)
    with pytest.raises(ValueError, match="0 tokens"):
        batcher.add("a", [3, 0])
    assert len(batcher) == 0


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def keys(batch):
    return [(s.request_key, s.index) for s in batch]


def test_interactive_leaves_before_earlier_batch_work_fcfs_within_each_class():
    batcher = PriorityBatcher(max_batch_tokens=100, max_batch_sequences=100, clock=FakeClock())
    batcher.add("b1", [3, 3], BATCH)
    batcher.add("i1", [2], INTERACTIVE)
    batcher.add("b2", [4], BATCH)
    batcher.add("i2", [1, 1], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("i1", 0), ("i2", 0), ("i2", 1), ("b1", 0), ("b1", 1), ("b2", 0)]


def test_batch_work_waits_behind_interactive_work_that_does_not_fit():
    batcher = PriorityBatcher(max_batch_tokens=10, max_batch_sequences=100, clock=FakeClock())
    batcher.add("b", [1], BATCH)
    batcher.add("i", [6, 6], INTERACTIVE)
    # The second interactive sequence does not fit: the small batch sequence must not jump ahead of it.
    assert keys(batcher.next_batch()) == [("i", 0)]
    assert keys(batcher.next_batch()) == [("i", 1), ("b", 0)]


def test_one_class_is_plain_fcfs():
    """With every request in one class the batches are exactly the longest FCFS prefixes that fit."""
    rng = random.Random(5)
    for priority in (INTERACTIVE, BATCH):
        clock = FakeClock()
        batcher = PriorityBatcher(max_batch_tokens=48, max_batch_sequences=6, batch_promote_s=0.5, clock=clock)
        expected_queue = []
        for r in range(40):
            lens = [rng.randint(1, 60) for _ in range(rng.randint(1, 5))]
            batcher.add(r, lens, priority)
            expected_queue += [(r, i, n) for i, n in enumerate(lens)]
            if rng.random() < 0.5:
                clock.now += rng.random()
                batch = batcher.next_batch()
                want, tokens = [], 0
                while expected_queue and len(want) < 6 and (not want or tokens + expected_queue[0][2] <= 48):
                    tokens += expected_queue[0][2]
                    want.append(expected_queue.pop(0))
                assert [(s.request_key, s.index, s.num_tokens) for s in batch] == want
        assert batcher.promoted == 0


@pytest.mark.parametrize("class_budget, backfill", [(None, None), (24, None), (24, 0), (None, 10)])
def test_random_mix_keeps_budget_cap_class_order_and_token_counts(class_budget, backfill):
    rng = random.Random(7)
    clock = FakeClock()
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=5, batch_promote_s=1.0, clock=clock,
                              max_batch_class_tokens=class_budget, max_backfill_tokens=backfill)
    added = {INTERACTIVE: [], BATCH: []}
    left = {INTERACTIVE: [], BATCH: []}
    for r in range(300):
        priority = rng.choice(PRIORITIES)
        lens = [rng.randint(1, 80) for _ in range(rng.randint(1, 6))]
        batcher.add(r, lens, priority)
        added[priority] += [(r, i) for i in range(len(lens))]
        if rng.random() < 0.1:
            dropped = rng.randrange(r + 1)
            queued = {(s.request_key, s.index) for s in batcher.queued() if s.request_key == dropped}
            assert batcher.drop(dropped) == len(queued)
            for p in PRIORITIES:
                added[p] = [k for k in added[p] if k not in queued]
        clock.now += rng.random() * 0.7
        batch = batcher.next_batch() if rng.random() < 0.6 else []
        assert len(batch) <= 5
        assert sum(s.num_tokens for s in batch) <= 64 or len(batch) == 1
        batch_class = [s.num_tokens for s in batch if s.priority == BATCH]
        assert sum(batch_class) <= (class_budget or 64) or len(batch_class) == 1  # a longer one leaves alone
        if backfill is not None and any(s.priority == INTERACTIVE for s in batch):
            backfilled = batch_class[1:] if batch[0].priority == BATCH else batch_class  # [0]: promoted
            assert sum(backfilled) <= backfill
        for s in batch:
            left[s.priority].append((s.request_key, s.index))
        queued = batcher.queued()
        for p in PRIORITIES:
            assert batcher.tokens[p] == sum(s.num_tokens for s in queued if s.priority == p)
        assert batcher.queued_tokens == sum(s.num_tokens for s in queued)
    while len(batcher):
        clock.now += 0.1
        for s in batcher.next_batch():
            left[s.priority].append((s.request_key, s.index))
    for p in PRIORITIES:  # FCFS within each class, nothing lost, nothing twice
        assert left[p] == added[p]
    assert batcher.promoted > 0  # the mix did exercise promotion


def test_batch_work_is_promoted_when_interactive_work_fills_every_batch():
    clock = FakeClock()
    batcher = PriorityBatcher(max_batch_tokens=8, max_batch_sequences=8, batch_promote_s=1.0, clock=clock)
    batcher.add("bulk", [4, 4, 4], BATCH)
    served = []
    for step in range(30):  # a stream of interactive work, one full batch of it per 0.25 s
        batcher.add(f"q{step}", [8], INTERACTIVE)
        clock.now += 0.25
        served += [(step, s.request_key, s.index) for s in batcher.next_batch() if s.request_key == "bulk"]
    # Passed over from step 0 (t=0.25): promoted in the first batch more than 1 s later (step 5, t=1.5),
    # alone (4 + 8 > 8); passed over again from step 6 (t=1.75): promoted at step 11, and so on.
    assert served == [(5, "bulk", 0), (11, "bulk", 1), (17, "bulk", 2)]
    assert batcher.promoted == 3


def test_no_promotion_while_batch_work_fills_the_room_interactive_work_leaves():
    """The backfill: batch work leaves in every batch, so however long its requests have queued,
    none is promoted and each interactive request leaves in the very next batch."""
    clock = FakeClock()
    batcher = PriorityBatcher(max_batch_tokens=16, max_batch_sequences=64, batch_promote_s=1.0, clock=clock)
    for r in range(4):
        batcher.add(f"bulk{r}", [4] * 64, BATCH)  # 64 batches of work queued
    for step in range(40):
        batcher.add(f"q{step}", [2], INTERACTIVE)
        clock.now += 2.0  # each batch takes longer than the promotion bound
        batch = batcher.next_batch()
        assert keys(batch)[0] == (f"q{step}", 0)
        assert sum(s.num_tokens for s in batch) == 14 and batch[-1].priority == BATCH
    assert batcher.promoted == 0


def test_a_promoted_sequence_longer_than_the_budget_leaves_alone():
    clock = FakeClock()
    batcher = PriorityBatcher(max_batch_tokens=8, max_batch_sequences=8, batch_promote_s=1.0, clock=clock)
    batcher.add("long", [20], BATCH)
    batcher.add("q", [2], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("q", 0)]  # passes "long" over at t=0
    batcher.add("q2", [2], INTERACTIVE)
    clock.now = 1.5
    assert keys(batcher.next_batch()) == [("long", 0)]
    assert keys(batcher.next_batch()) == [("q2", 0)]


def test_steps_of_batch_work_alone_keep_to_the_batch_class_budget_in_arrival_order():
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=64, clock=FakeClock(), max_batch_class_tokens=16)
    batcher.add("bulk", [4] * 9, BATCH)
    batcher.add("long", [40], BATCH)
    batcher.add("after", [4], BATCH)
    assert [keys(b) for b in drain(batcher)] == [
        [("bulk", i) for i in range(4)], [("bulk", i) for i in range(4, 8)], [("bulk", 8)],  # "long" does not fit
        [("long", 0)],  # longer than the batch-class budget: alone
        [("after", 0)]]


def test_interactive_work_fills_the_budget_and_batch_work_backfills_only_its_own_budget():
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=64, clock=FakeClock(), max_batch_class_tokens=8)
    batcher.add("bulk", [4] * 6, BATCH)
    batcher.add("q", [20, 20], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("q", 0), ("q", 1), ("bulk", 0), ("bulk", 1)]
    batcher.add("q2", [50], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("q2", 0), ("bulk", 2), ("bulk", 3)]  # 50 + 8 <= 64
    assert keys(batcher.next_batch()) == [("bulk", 4), ("bulk", 5)]


def test_a_backfill_budget_of_zero_keeps_batch_work_out_of_interactive_steps_only():
    clock = FakeClock()
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=64, batch_promote_s=1.0, clock=clock,
                              max_batch_class_tokens=16, max_backfill_tokens=0)
    batcher.add("bulk", [4] * 12, BATCH)
    batcher.add("q", [2, 2], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("q", 0), ("q", 1)]  # alone, though 60 tokens of room are left
    assert keys(batcher.next_batch()) == [("bulk", i) for i in range(4)]  # batch work alone: its class budget
    batcher.add("q2", [2], INTERACTIVE)
    clock.now = 1.5  # the last batch took batch work: none is passed over yet, so none is promoted
    assert keys(batcher.next_batch()) == [("q2", 0)]
    batcher.add("q3", [2], INTERACTIVE)
    clock.now = 3.0  # passed over since t=1.5 for 1.5 s: its head is promoted, and nothing more backfills
    assert keys(batcher.next_batch()) == [("bulk", 4), ("q3", 0)]
    assert batcher.promoted == 1


def test_a_backfill_budget_bounds_the_batch_work_behind_interactive_work():
    batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=64, clock=FakeClock(),
                              max_batch_class_tokens=16, max_backfill_tokens=8)
    batcher.add("bulk", [4] * 6, BATCH)
    batcher.add("q", [20], INTERACTIVE)
    assert keys(batcher.next_batch()) == [("q", 0), ("bulk", 0), ("bulk", 1)]
    assert keys(batcher.next_batch()) == [("bulk", i) for i in range(2, 6)]


def test_a_batch_class_budget_as_large_as_the_budget_changes_nothing():
    rng = random.Random(11)
    runs = []
    for class_budget in (None, 64, 1000):
        batcher = PriorityBatcher(max_batch_tokens=64, max_batch_sequences=5, clock=FakeClock(),
                                  max_batch_class_tokens=class_budget)
        rng.seed(11)
        for r in range(60):
            batcher.add(r, [rng.randint(1, 40) for _ in range(rng.randint(1, 4))], rng.choice(PRIORITIES))
        runs.append([keys(b) for b in drain(batcher)])
    assert runs[0] == runs[1] == runs[2]


def test_the_batch_class_budget_auto_is_small_on_a_cpu_only():
    assert batch_class_budget(-1, 8192, on_cpu=True) == CPU_BATCH_CLASS_TOKENS < 8192
    assert batch_class_budget(-1, 128, on_cpu=True) == 128  # never above the budget
    assert batch_class_budget(-1, 8192, on_cpu=False) == 8192
    assert batch_class_budget(1024, 8192, on_cpu=False) == 1024
    with pytest.raises(ValueError, match="max_batch_class_tokens"):
        PriorityBatcher(64, 8, max_batch_class_tokens=0)


def test_the_backfill_budget_auto_is_none_on_a_cpu_only():
    assert backfill_budget(-1, 256, on_cpu=True) == CPU_BACKFILL_TOKENS == 0
    assert backfill_budget(-1, 8192, on_cpu=False) == 8192
    assert backfill_budget(64, 8192, on_cpu=True) == 64
    assert backfill_budget(512, 256, on_cpu=True) == 256  # never above the batch-class budget
    with pytest.raises(ValueError, match="max_backfill_tokens"):
        PriorityBatcher(64, 8, max_backfill_tokens=-1)


def test_drop_removes_a_request_from_its_class():
    batcher = PriorityBatcher(max_batch_tokens=100, max_batch_sequences=100, clock=FakeClock())
    batcher.add("b", [5, 5], BATCH)
    batcher.add("i", [3], INTERACTIVE)
    assert batcher.depth(BATCH) == 2 and batcher.depth(INTERACTIVE) == 1
    assert batcher.drop("b") == 2 and batcher.drop("missing") == 0
    assert batcher.tokens == {INTERACTIVE: 3, BATCH: 0} and batcher.queued_tokens == 3
    assert keys(batcher.next_batch()) == [("i", 0)]


def test_unknown_priority_and_bad_bound_refused():
    batcher = PriorityBatcher(10, 10)
    with pytest.raises(ValueError, match="priority"):
        batcher.add("a", [1], "urgent")
    assert len(batcher) == 0
    with pytest.raises(ValueError, match="batch_promote_s"):
        PriorityBatcher(10, 10, batch_promote_s=0)


def test_scheduler_imports_neither_torch_nor_triton():
    import subprocess
    import sys

    code = ("import sys, engine_lib.service.scheduler; "
            "bad = [m for m in ('torch', 'triton_python_backend_utils', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

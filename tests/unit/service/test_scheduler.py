"""FcfsBatcher: FCFS order, budget and cap, long sequences alone, no starvation."""
import random

import pytest

from engine_lib.service.scheduler import FcfsBatcher


def drain(batcher):
    batches = []
    while len(batcher):
        batches.append(batcher.next_batch())
    return batches


def test_fcfs_order_across_requests():
    batcher = FcfsBatcher(max_batch_tokens=10, max_batch_sequences=100)
    batcher.add("a", [3, 3])
    batcher.add("b", [2])
    batcher.add("c", [4, 1])
    flat = [(s.request_key, s.index) for batch in drain(batcher) for s in batch]
    assert flat == [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]


def test_budget_and_cap_respected():
    rng = random.Random(0)
    batcher = FcfsBatcher(max_batch_tokens=64, max_batch_sequences=5)
    for r in range(50):
        batcher.add(r, [rng.randint(1, 40) for _ in range(rng.randint(1, 8))])
    for batch in drain(batcher):
        assert 1 <= len(batch) <= 5
        assert sum(s.num_tokens for s in batch) <= 64


def test_batch_is_maximal_fcfs_prefix():
    batcher = FcfsBatcher(max_batch_tokens=10, max_batch_sequences=100)
    batcher.add("a", [4, 4, 4, 1])
    first = batcher.next_batch()
    # The third sequence (4) would exceed 10; the 1 behind it must not jump the queue.
    assert [s.num_tokens for s in first] == [4, 4]
    assert [s.num_tokens for s in batcher.next_batch()] == [4, 1]


def test_long_sequence_goes_alone():
    batcher = FcfsBatcher(max_batch_tokens=16, max_batch_sequences=8)
    batcher.add("short", [2])
    batcher.add("long", [100])
    batcher.add("after", [3])
    batches = drain(batcher)
    assert [[s.num_tokens for s in b] for b in batches] == [[2], [100], [3]]


def test_no_request_starves_under_continuous_arrivals():
    batcher = FcfsBatcher(max_batch_tokens=32, max_batch_sequences=4)
    batcher.add("victim", [30])
    served_at = None
    for step in range(20):
        batcher.add(f"small{step}", [1, 1])  # a stream of small work keeps arriving
        if any(s.request_key == "victim" for s in batcher.next_batch()):
            served_at = step
            break
    assert served_at == 0


def test_queued_tokens_and_drop():
    batcher = FcfsBatcher(max_batch_tokens=100, max_batch_sequences=100)
    batcher.add("a", [5, 5])
    batcher.add("b", [7])
    assert batcher.queued_tokens == 17
    assert batcher.drop("a") == 2
    assert batcher.queued_tokens == 7
    assert [s.request_key for s in batcher.next_batch()] == ["b"]
    assert batcher.queued_tokens == 0


def test_invalid_input_refused():
    with pytest.raises(ValueError):
        FcfsBatcher(0, 1)
    batcher = FcfsBatcher(10, 10)
    with pytest.raises(ValueError, match="0 tokens"):
        batcher.add("a", [3, 0])
    assert len(batcher) == 0


def test_scheduler_imports_neither_torch_nor_triton():
    import subprocess
    import sys

    code = ("import sys, engine_lib.service.scheduler; "
            "bad = [m for m in ('torch', 'triton_python_backend_utils', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

"""EncoderService with a deterministic fake engine: routing, order, options, errors."""
import threading

import numpy as np
import pytest

from engine_lib.errors import InputError
from engine_lib.lazy_tensor import ResolvedTensor
from engine_lib.options import RequestOptions
from engine_lib.serving import EncoderService


class FakeEngine:
    """Row for a sequence = [sum(ids), len, first id, 1, ...]: identifies its sequence."""

    hidden_size = 8
    vocab_size = 1000
    max_positions = 64

    def __init__(self):
        self.batches = []

    def step(self, batch):
        self.batches.append(batch)
        rows = np.ones((batch.num_seqs, self.hidden_size), dtype=np.float32)
        for i in range(batch.num_seqs):
            ids = batch.input_ids[batch.cu_seqlens[i]:batch.cu_seqlens[i + 1]]
            rows[i, :3] = [ids.sum(), len(ids), ids[0]]
        return ResolvedTensor(rows)


def expected_row(ids):
    row = np.ones(FakeEngine.hidden_size, dtype=np.float32)
    row[:3] = [ids.sum(), len(ids), ids[0]]
    return row


def submit_and_wait(service, sequences, options=RequestOptions(normalize=False)):
    done = threading.Event()
    result = {}

    def on_done(rows, error):
        result.update(rows=rows, error=error)
        done.set()

    ids = np.concatenate(sequences)
    service.submit(ids, np.array([len(s) for s in sequences]), options, on_done)
    return done, result


def test_each_request_gets_its_own_rows_in_order():
    engine = FakeEngine()
    service = EncoderService(engine, max_batch_tokens=20, max_batch_sequences=3)
    rng = np.random.default_rng(0)
    requests = [[rng.integers(1, 999, rng.integers(1, 30)) for _ in range(rng.integers(1, 6))] for _ in range(40)]
    pending = [(seqs, *submit_and_wait(service, seqs)) for seqs in requests]
    for seqs, done, result in pending:
        assert done.wait(10)
        assert result["error"] is None
        np.testing.assert_array_equal(result["rows"], np.stack([expected_row(s) for s in seqs]))
    service.close()
    assert all(b.num_tokens <= 20 or b.num_seqs == 1 for b in engine.batches)
    assert all(b.num_seqs <= 3 for b in engine.batches)


def test_options_dimensions_and_normalize():
    service = EncoderService(FakeEngine(), 100, 10)
    done, result = submit_and_wait(service, [np.array([3, 4])], RequestOptions(dimensions=2, normalize=True))
    assert done.wait(10)
    np.testing.assert_allclose(result["rows"], [[7 / np.hypot(7, 2), 2 / np.hypot(7, 2)]], rtol=1e-6)
    service.close()


@pytest.mark.parametrize("ids, lens, message", [
    (np.array([1, 2, 3]), np.array([2]), "sums to 2"),
    (np.array([1, 2]), np.array([2, 0]), "SEQ_LENS\\[1\\] is 0"),
    (np.array([], dtype=np.int64), np.array([], dtype=np.int64), "SEQ_LENS is empty"),
    (np.array([1, 5000]), np.array([2]), "outside \\[0, 1000\\)"),
    (np.arange(1, 101), np.array([100]), "at most 64"),
])
def test_bad_input_refused_before_queuing(ids, lens, message):
    service = EncoderService(FakeEngine(), 100, 10)
    with pytest.raises(InputError, match=message):
        service.submit(ids, lens, RequestOptions(), lambda rows, error: None)
    service.close()


def test_failed_step_fails_only_its_requests():
    class FlakyEngine(FakeEngine):
        def step(self, batch):
            if 666 in batch.input_ids:
                raise RuntimeError("boom")
            return super().step(batch)

    service = EncoderService(FlakyEngine(), max_batch_tokens=4, max_batch_sequences=1)
    bad_done, bad = submit_and_wait(service, [np.array([666, 1])])
    good_done, good = submit_and_wait(service, [np.array([5, 6])])
    assert bad_done.wait(10) and good_done.wait(10)
    assert "boom" in str(bad["error"]) and bad["rows"] is None
    assert good["error"] is None
    service.close()


def test_close_drains_queued_and_inflight_work():
    class SlowEngine(FakeEngine):
        def step(self, batch):
            import time
            time.sleep(0.01)
            return super().step(batch)

    service = EncoderService(SlowEngine(), max_batch_tokens=8, max_batch_sequences=2)
    pending = [submit_and_wait(service, [np.array([i + 1, 2, 3])]) for i in range(30)]
    service.close()
    assert all(done.is_set() and result["error"] is None for done, result in pending)

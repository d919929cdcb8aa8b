"""Dispatcher logic with in-process replicas (the real servers: test_client_e2e.py)."""
import threading
import time

import numpy as np
import pytest

from rose_client.chunking import plan_chunks
from rose_client.dispatch import Dispatcher, JobFailed, RetryPolicy
from rose_client.stream import ReplicaError

FAST = RetryPolicy(max_attempts=3, base_cooldown_s=0.01, max_cooldown_s=0.05, max_unavailable_s=0.5)


class FakeReplica:
    """Embeds text "t<i>" as the row [i]; can die after a number of calls."""

    def __init__(self, url, die_after=None, delay=0.002):
        self.url, self.die_after, self.delay = url, die_after, delay
        self.calls, self.active, self.max_active = 0, 0, 0
        self.lock = threading.Lock()

    @property
    def dead(self):
        return self.die_after is not None and self.calls >= self.die_after

    def slot(self):
        replica = self

        class Slot:
            def embed(self, texts, parameters):
                with replica.lock:
                    if replica.dead:
                        raise ReplicaError(replica.url, "connection refused")
                    replica.calls += 1
                    replica.active += 1
                    replica.max_active = max(replica.max_active, replica.active)
                time.sleep(replica.delay)
                with replica.lock:
                    replica.active -= 1
                return np.array([[float(t[1:])] for t in texts], dtype=np.float32)

            def is_ready(self):
                return not replica.dead

            def close(self):
                pass

        return Slot()


def run_job(replicas, num_texts=200, inflight=3, retry=FAST):
    texts = [f"t{i}" for i in range(num_texts)]
    chunks = plan_chunks([1] * num_texts, max_chunk_tokens=7, max_chunk_texts=100)
    by_url = {r.url: r for r in replicas}
    dispatcher = Dispatcher(list(by_url), lambda url: by_url[url].slot(), inflight, retry)
    delivered = []
    dispatcher.run(chunks, lambda c: texts[c.start:c.stop], lambda c, rows: delivered.append((c, rows)))
    return chunks, delivered, dispatcher


def assert_complete_once(chunks, delivered):
    assert sorted(c.index for c, _ in delivered) == [c.index for c in chunks]
    for chunk, rows in delivered:
        np.testing.assert_array_equal(rows[:, 0], np.arange(chunk.start, chunk.stop))


def test_spreads_over_replicas_with_bounded_inflight():
    replicas = [FakeReplica("a"), FakeReplica("b")]
    chunks, delivered, dispatcher = run_job(replicas, inflight=3)
    assert_complete_once(chunks, delivered)
    assert all(r.calls > 0 and r.max_active <= 3 for r in replicas)
    assert sum(r.completed_chunks for r in dispatcher.replicas) == len(chunks)


def test_dead_replica_loses_and_duplicates_nothing():
    dying, healthy = FakeReplica("dying", die_after=5), FakeReplica("healthy")
    chunks, delivered, dispatcher = run_job([dying, healthy])
    assert_complete_once(chunks, delivered)
    state = {r.url: r for r in dispatcher.replicas}
    assert state["dying"].completed_chunks == 5
    assert state["healthy"].completed_chunks == len(chunks) - 5
    # once down, the dying replica is probed, not handed chunks: few chunk attempts fail there
    assert 1 <= state["dying"].failed_chunks <= 3


def test_a_chunk_failing_everywhere_fails_the_job():
    replicas = [FakeReplica("a", die_after=0), FakeReplica("b", die_after=0)]
    by_url = {r.url: r for r in replicas}

    def always_ready_slot(url):
        slot = by_url[url].slot()
        slot.is_ready = lambda: True  # a replica that looks healthy but fails every chunk
        return slot

    dispatcher = Dispatcher(list(by_url), always_ready_slot, 2, FAST)
    chunks = plan_chunks([1] * 10, 5, 100)
    with pytest.raises(JobFailed, match=r"chunk \d \(texts \d+\.\.\d+\) failed 3 times"):
        dispatcher.run(chunks, lambda c: [f"t{i}" for i in range(c.start, c.stop)], lambda c, r: None)


def test_no_replica_answering_fails_the_job_in_bounded_time():
    started = time.monotonic()
    with pytest.raises(JobFailed, match="no replica answered"):
        run_job([FakeReplica("a", die_after=0), FakeReplica("b", die_after=0)])
    assert time.monotonic() - started < 5


def test_a_chunk_refused_as_invalid_input_fails_at_once_without_retries():
    replicas = [FakeReplica("a"), FakeReplica("b")]
    by_url = {r.url: r for r in replicas}

    def refusing_slot(url):
        slot = by_url[url].slot()

        def embed(texts, parameters):
            by_url[url].calls += 1
            raise ReplicaError(url, "[StatusCode.INVALID_ARGUMENT] invalid input: TEXT[0] is empty")

        slot.embed = embed
        return slot

    dispatcher = Dispatcher(list(by_url), refusing_slot, 2, FAST)
    chunks = plan_chunks([1] * 4, 10, 100)
    with pytest.raises(JobFailed, match=r"chunk 0 \(texts 0\.\.3\) was refused: .*TEXT\[0\] is empty"):
        dispatcher.run(chunks, lambda c: [f"t{i}" for i in range(c.start, c.stop)], lambda c, r: None)
    assert sum(r.calls for r in replicas) == 1

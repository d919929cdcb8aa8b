"""Chunk planning, token counting and replica addresses (no server)."""
import pytest

from rose_client.chunking import plan_chunks, plan_fingerprint
from rose_client.replicas import resolve_replicas
from rose_client.tokens import ByteEstimator, TokenizerCounter


def test_chunks_cover_input_in_order_within_limits():
    counts = [5, 7, 3, 100, 2, 2, 2, 2, 9]
    chunks = plan_chunks(counts, max_chunk_tokens=12, max_chunk_texts=3)
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 3), (3, 4), (4, 7), (7, 9)]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert c.num_tokens == sum(counts[c.start:c.stop])
        assert c.num_texts <= 3 and (c.num_tokens <= 12 or c.num_texts == 1)


def test_text_cap_and_empty_input():
    assert [(c.start, c.stop) for c in plan_chunks([600, 600], 1100, 10)] == [(0, 1), (1, 2)]
    assert [(c.start, c.stop) for c in plan_chunks([600, 600], 1100, 10, max_text_tokens=512)] == [(0, 2)]
    assert plan_chunks([], 10, 10) == []
    with pytest.raises(ValueError):
        plan_chunks([1], 0, 10)


def test_fingerprint_changes_with_boundaries():
    a = plan_chunks([3] * 10, 9, 100)
    assert plan_fingerprint(a) == plan_fingerprint(plan_chunks([3] * 10, 9, 100))
    assert plan_fingerprint(a) != plan_fingerprint(plan_chunks([3] * 10, 12, 100))


def test_byte_estimate_tracks_the_real_tokenizer(model_dir):
    texts = ["hello world", "a much longer sentence about vector search and embedding models " * 4]
    exact = TokenizerCounter(model_dir).count(texts)
    estimate = ByteEstimator().count(texts)
    assert exact[0] == 4  # [CLS] hello world [SEP]
    for e, x in zip(estimate, exact):
        assert 0.5 * x <= e <= 2 * x


def test_replica_addresses():
    assert resolve_replicas(["a:1", "b", "a:1", "[::1]:9"]) == ["a:1", "b:8001", "[::1]:9"]
    assert "127.0.0.1:8001" in resolve_replicas(["dns:///localhost:8001"])
    with pytest.raises(ValueError):
        resolve_replicas(["host:grpc"])

"""The encoder's custom metrics on the real server's /metrics endpoint."""
from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.tokenization.text import TextTokenizer
from testing.embed_clients import embed_stream
from testing.metrics import sample, scrape
from testing.texts import MEDIUM_TEXTS
from testing.waiting import wait_until

FAMILIES = {"rose_queue_requests": "gauge", "rose_queue_tokens": "gauge", "rose_step_tokens": "histogram",
            "rose_step_sequences": "histogram", "rose_step_seconds": "histogram",
            "rose_requests_total": "counter", "rose_refused_total": "counter",
            "rose_cancelled_sequences_total": "counter", "rose_hop_seconds_total": "counter",
            "rose_queue_sequences": "gauge", "rose_wait_seconds": "histogram", "rose_priority_tokens_total": "counter",
            "rose_promoted_sequences_total": "counter"}


def wait_for(server, predicate, timeout=60):
    wait_until(lambda: predicate(scrape(server)[1]), timeout, "the metrics to reach the expected values", 0.2)


def test_every_encoder_metric_family_is_published(server):
    body, _ = scrape(server)
    for name, kind in FAMILIES.items():
        assert f"# TYPE {name} {kind}" in body, name
    assert 'rose_refused_total{model="rose_encoder",reason="queue_tokens",version="1"}' in body
    assert 'rose_priority_tokens_total{model="rose_encoder",priority="batch",version="1"}' in body


def test_metrics_follow_traffic(server, model_dir):
    _, before = scrape(server)
    texts = MEDIUM_TEXTS
    seq_lens = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions()).seq_lens
    embed_stream(server.grpc_url, texts)
    embed_stream(server.grpc_url, texts, {"priority_class": "batch"})
    with pytest.raises(InferenceServerException, match="invalid input"):
        embed_stream(server.grpc_url, ["x"], {"dimensions": 100_000})

    def moved(now):
        delta = lambda name, **labels: sample(now, name, **labels) - sample(before, name, **labels)
        return (delta("rose_requests_total", outcome="ok") >= 1
                and delta("rose_requests_total", outcome="invalid") >= 1
                and delta("rose_step_sequences_sum") >= len(texts)
                and delta("rose_step_tokens_sum") >= int(seq_lens.sum())
                and delta("rose_step_seconds_count") >= 1
                and delta("rose_priority_tokens_total", priority="batch") >= int(seq_lens.sum())
                and delta("rose_priority_tokens_total", priority="interactive") >= int(seq_lens.sum())
                and delta("rose_wait_seconds_count", priority="batch") >= 1)

    wait_for(server, moved)
    _, now = scrape(server)
    assert sample(now, "rose_step_seconds_sum") > sample(before, "rose_step_seconds_sum")
    # Everything answered: the queue gauges come back to zero at the next publish.
    wait_for(server, lambda now: sample(now, "rose_queue_requests") == 0 and sample(now, "rose_queue_tokens") == 0
             and sample(now, "rose_queue_sequences", priority="batch") == 0)

"""The gateway alone (`python -m gateway`) over two real tritonservers: a
1,000-text input spread over both, and one replica killed mid-job.

Replica A is the session's server, replica B starts here (`--no-gateway`);
the last test kills B."""
import os
import random
import signal
import threading
import urllib.request

import numpy as np
import openai
import pytest

from engine_lib.runner.self_check import MIN_COSINE
from testing.embed_clients import embed_stream
from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until

MODEL = "all-MiniLM-L6-v2"
WORDS = ("vector search index shard replica token batch kernel graph query document ranking "
         "latency throughput encoder pooling Ünïcödé 你好").split()


def make_texts(num_texts, seed):
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for i in range(num_texts)]


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def gateway(replicas, tmp_path_factory):
    """Small chunks and two in flight per replica, so a job spans many chunks on both."""
    process = GatewayProcess(tmp_path_factory.mktemp("gateway") / "gateway.log", [r.grpc_url for r in replicas],
                             ["--max-chunk-tokens", "512", "--max-chunk-texts", "32",
                              "--max-inflight-per-replica", "2"])
    yield process
    process.stop()


def replica_metrics(gateway, name):
    with urllib.request.urlopen(f"{gateway.url}/metrics") as r:
        lines = r.read().decode().splitlines()
    prefix = f'{name}{{replica="'
    return {line[len(prefix):].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in lines if line.startswith(prefix)}


def embed(gateway, texts):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)
    response = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in response.data] == list(range(len(texts)))
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_thousand_texts_over_two_replicas_match_the_reference(gateway, replicas, reference_model):
    """Every row against its own text's reference: no two of these texts' references are within
    cosine 0.95 of each other, so a row lost, moved or doubled cannot pass."""
    texts = make_texts(1000, seed=1)
    rows = embed(gateway, texts)
    assert rows.shape == (1000, 384)
    reference = reference_model.encode(texts, normalize_embeddings=True, batch_size=128)
    assert cosine(rows, reference).min() >= MIN_COSINE
    completed = replica_metrics(gateway, "gateway_replica_chunks_completed")
    assert all(completed[r.grpc_url] > 0 for r in replicas), completed


def test_killing_a_replica_mid_job_loses_and_duplicates_nothing(gateway, replicas):
    """Runs last in this module: it kills replica B."""
    a, b = replicas
    texts = make_texts(400, seed=2)
    before = replica_metrics(gateway, "gateway_replica_chunks_completed")
    result = {}
    job = threading.Thread(target=lambda: result.setdefault("rows", embed(gateway, texts)), daemon=True)
    with a.hold:  # A keeps its chunks (testing/hold.py): the job cannot end before B did some and died
        job.start()
        def b_did_some():
            assert job.is_alive(), "the job ended before B took chunks"
            return replica_metrics(gateway, "gateway_replica_chunks_completed")[b.grpc_url] >= before[b.grpc_url] + 3

        wait_until(b_did_some, 120, "B to take three chunks", 0.02)
        os.killpg(b.process.pid, signal.SIGKILL)
        b.process.wait()
    job.join(300)
    assert "rows" in result, "the job did not finish after B died"
    rows = result["rows"]
    expected = embed_stream(a.grpc_url, texts)
    assert cosine(rows, expected).min() >= 0.9999  # each row is its own text's: nothing lost, moved or doubled
    with urllib.request.urlopen(f"{gateway.url}/health") as r:
        assert r.status == 200  # A still serves

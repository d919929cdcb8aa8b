"""rose_client and the bulk tool against two real tritonservers on loopback.

Replica A is the session's server, replica B starts here. The last test kills B.
The Qwen3 embedder served by name in the session's multi-model launch plays "another
model" for the bulk tool's resume check (--model NAME).
"""
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest

from rose_client import EmbeddingClient, bulk
from rose_client.store import ResumableOutput
from rose_triton.server import REPO
from testing.embed_clients import embed_stream

WORDS = ("vector search index shard replica token batch kernel graph query document ranking "
         "latency throughput encoder pooling Ünïcödé 你好").split()


def make_texts(num_texts, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) for _ in range(num_texts)]


TEXTS = make_texts(400)
SMALL_CHUNKS = dict(max_chunk_tokens=512, max_chunk_texts=32)


@pytest.fixture(scope="module")
def single_server_rows(replicas):
    return EmbeddingClient([replicas[0].grpc_url], **SMALL_CHUNKS).embed(TEXTS)


def test_two_replicas_equal_one_row_for_row(replicas, single_server_rows):
    client = EmbeddingClient([r.grpc_url for r in replicas], **SMALL_CHUNKS)
    progress = []
    rows = client.embed(TEXTS, on_progress=lambda done, total: progress.append((done, total)))
    np.testing.assert_allclose(rows, single_server_rows, rtol=0, atol=1e-6)
    assert rows.shape == (len(TEXTS), 384)
    assert all(r.completed_chunks > 0 for r in client.last_dispatcher.tasks.replicas.values())
    assert progress[-1] == (len(TEXTS), len(TEXTS)) and len(progress) == len(client.plan(TEXTS))


def test_request_parameters_pass_through(replicas):
    texts, params = TEXTS[:20], {"normalize": False, "dimensions": 64, "input_type": "query"}
    rows = EmbeddingClient([r.grpc_url for r in replicas], max_chunk_texts=6).embed(texts, params)
    assert rows.shape == (20, 64)
    assert not np.allclose(np.linalg.norm(rows, axis=1), 1)
    np.testing.assert_allclose(rows, embed_stream(replicas[0].grpc_url, texts, params), rtol=0, atol=1e-6)


def bulk_command(input_path, output_path, replicas, model=None):
    urls = [arg for r in replicas for arg in ("--url", r.grpc_url)]
    return [sys.executable, "-m", "rose_client.bulk", str(input_path), str(output_path), *urls,
            "--max-chunk-tokens", "512", "--max-inflight", "2", "--no-progress", *(["--model", model] if model else [])]


KILLED_AFTER_8_CHUNKS = """
import os, signal, sys
from rose_client import bulk
from rose_client.store import ResumableOutput
real_write, written = ResumableOutput.write, []
def write_8_then_die(self, chunk, rows):
    if len(written) == 8:
        os.kill(os.getpid(), signal.SIGKILL)
    written.append(chunk.index)
    real_write(self, chunk, rows)
ResumableOutput.write = write_8_then_die
sys.exit(bulk.main(sys.argv[1:]))
"""


def test_bulk_interrupted_and_resumed_writes_the_same_rows(replicas, single_server_rows, tmp_path):
    """The first run is SIGKILLed (by itself, at its ninth chunk's write: the same point on any
    machine); the same command resumes and writes the rows one uninterrupted run writes."""
    input_path, output_path = tmp_path / "docs.txt", tmp_path / "vectors.npy"
    input_path.write_text("".join(t + "\n" for t in TEXTS))
    journal = tmp_path / "vectors.npy.journal"
    command = bulk_command(input_path, output_path, replicas)
    first = subprocess.run([sys.executable, "-c", KILLED_AFTER_8_CHUNKS, *command[3:]], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stderr
    done_before = journal.read_text().count("\n") - 1  # minus the header line
    assert not output_path.exists()

    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    resumed = int(second.stderr.split("resuming: ")[1].split(" of ")[0])
    total = int(second.stderr.split(" of ")[1].split(" chunks")[0])
    assert done_before == resumed == 8 < total
    np.testing.assert_allclose(np.load(output_path), single_server_rows, rtol=0, atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["docs.txt", "vectors.npy"]


def test_bulk_resumed_against_another_model_is_refused(replicas, multi_server, single_server_rows, tmp_path,
                                                       monkeypatch, capsys):
    """The first run stops after two chunks (a full disk, injected in this process); the
    same job on the Qwen3 embedder served by name (--model), on the multi-model server alone or
    beside a replica that lacks that model (not used, with a warning), is refused and leaves
    the files as they were; against the first model it resumes and writes the same rows."""
    texts = TEXTS[:120]
    input_path, output_path = tmp_path / "docs.txt", tmp_path / "vectors.npy"
    input_path.write_text("".join(t + "\n" for t in texts))
    real_write, written = ResumableOutput.write, []

    def write_two_then_fail(self, chunk, rows):
        if len(written) == 2:
            raise OSError("no space left on device")
        written.append(chunk.index)
        real_write(self, chunk, rows)

    monkeypatch.setattr(ResumableOutput, "write", write_two_then_fail)
    with pytest.raises(OSError, match="no space left"):
        bulk.main(bulk_command(input_path, output_path, replicas)[3:])
    monkeypatch.undo()
    capsys.readouterr()
    kept = {p: p.read_bytes() for p in (tmp_path / "vectors.npy.journal", tmp_path / "vectors.npy.partial.npy")}
    for others in ([multi_server], [replicas[0], multi_server]):
        refused = subprocess.run(bulk_command(input_path, output_path, others, multi_server.embedder_name), cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "error: ModelMismatch: " in refused.stderr, refused.stderr
        assert (f"{replicas[0].grpc_url} did not answer the model probe" in refused.stderr) == (len(others) == 2)
        assert {p: p.read_bytes() for p in kept} == kept
    resumed = subprocess.run(bulk_command(input_path, output_path, replicas), cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0 and "resuming: 2 of " in resumed.stderr, resumed.stderr
    np.testing.assert_allclose(np.load(output_path), single_server_rows[:len(texts)], rtol=0, atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["docs.txt", "vectors.npy"]


def test_killing_a_replica_mid_job_loses_and_duplicates_nothing(replicas, single_server_rows):
    """Runs last in this module: it kills replica B."""
    a, b = replicas
    client = EmbeddingClient([a.grpc_url, b.grpc_url], **SMALL_CHUNKS)
    chunks = client.plan(TEXTS)
    deliveries = {}
    rows = np.zeros_like(single_server_rows)
    killed_at = []

    def keep(chunk, chunk_rows):
        deliveries[chunk.index] = deliveries.get(chunk.index, 0) + 1
        rows[chunk.start:chunk.stop] = chunk_rows

    def kill_b_early(done, total):
        if not killed_at and done >= total // 4:
            os.killpg(b.process.pid, signal.SIGKILL)
            b.process.wait()
            killed_at.append(done)

    client.run(TEXTS, chunks, keep, on_progress=kill_b_early)
    assert killed_at and killed_at[0] < len(TEXTS)
    assert deliveries == {c.index: 1 for c in chunks}
    np.testing.assert_allclose(rows, single_server_rows, rtol=0, atol=1e-6)
    state = client.last_dispatcher.tasks.replicas
    assert state[b.grpc_url].completed_chunks > 0 and state[b.grpc_url].failed_chunks > 0
    assert sum(r.completed_chunks for r in state.values()) == len(chunks)

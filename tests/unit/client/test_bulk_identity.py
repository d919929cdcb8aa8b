"""The bulk tool cannot mix models: the served model's identity in the resume header, the
replicas' probe, and the lock on the output (no server: fake replicas answer each text with
a vector that depends on the text and on the model they play)."""
import os
import signal
import subprocess
import sys
import zlib

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

import rose_client.client
from rose_client import EmbeddingClient, JobFailed, bulk
from rose_client.chunking import plan_chunks
from rose_client.identity import PROBE_TEXT, ModelIdentity, ModelMismatch
from rose_client.store import OutputLock, OutputLocked, ResumableOutput
from testing import REPO

DIM = 48
MODELS = {}  # url -> the model its fake replica plays ("A", "B", ...; "dead": refuses connections)
SENT = []  # (texts, request parameters) of every request the fake replicas answered


def vector(model, text, dim=DIM):
    return np.random.default_rng([ord(model), zlib.crc32(text)]).normal(size=dim).astype(np.float32)


class FakeChannel:
    """Stands in for ReplicaChannel: a stream answers TEXT with one vector per text."""

    def __init__(self, url):
        self.url, self.client, self.generation, self.slots = url, self, 0, []

    def stream_infer(self, requests):
        model = MODELS[self.url]

        class Stream:
            async def __anext__(self):
                request = await requests.__anext__()
                if model == "dead":
                    raise InferenceServerException("failed to connect to all addresses")
                (text,) = request["inputs"]
                texts = list(deserialize_bytes_tensor(text._get_content()))
                SENT.append((texts, request["parameters"] or {}))
                rows = np.stack([vector(model, t) for t in texts])

                class Result:
                    def as_numpy(self, name):
                        return rows if name == "EMBEDDINGS" else None

                return Result(), None

            def cancel(self):
                pass

        return Stream()

    async def is_ready(self, model=None):
        return MODELS[self.url] != "dead"

    async def close(self):
        pass


@pytest.fixture
def replicas(monkeypatch):
    MODELS.clear()
    SENT.clear()
    monkeypatch.setattr(rose_client.client, "ReplicaChannel", FakeChannel)
    return MODELS


def identity(model, name="ensemble", dim=DIM):
    return ModelIdentity.from_probe(name, vector(model, PROBE_TEXT.encode(), dim))


def test_an_identity_matches_its_model_within_rounding_and_no_other():
    a = identity("A")
    noisy = ModelIdentity.from_probe("ensemble", vector("A", PROBE_TEXT.encode()) * 1.01
                                     + np.random.default_rng(0).normal(scale=1e-3, size=DIM))
    assert a.matches(noisy) and a.matches(ModelIdentity.from_json(a.to_json()))
    assert not a.matches(identity("B"))
    assert not a.matches(identity("A", dim=2 * DIM)) and not a.matches(identity("A", name="embed"))
    assert ModelIdentity.from_json("ensemble") is None and not a.matches(None)  # an older journal


def test_replicas_are_probed_and_must_serve_one_model(replicas):
    replicas.update({"a:1": "A", "b:1": "A", "c:1": "dead"})
    client = EmbeddingClient(["a:1", "b:1", "c:1"])
    found, silent = client.model_identity({"input_type": "query"})
    assert found.matches(identity("A")) and found.dimensions == DIM
    assert list(silent) == ["c:1"] and client.urls == ["a:1", "b:1"]  # an unchecked replica takes no chunk
    replicas["b:1"] = "B"
    with pytest.raises(ModelMismatch, match="replicas serve different models: a:1 .* b:1"):
        EmbeddingClient(["a:1", "b:1"]).model_identity()
    replicas.update({"a:1": "dead", "b:1": "dead"})
    with pytest.raises(JobFailed, match="no replica answered the model probe"):
        EmbeddingClient(["a:1", "b:1"]).model_identity()


JOB = {"input_sha256": "x", "num_texts": 4, "chunk_plan": "p", "parameters": {"normalize": True}}


def test_a_journal_of_another_model_is_refused_and_left_as_it_was(tmp_path):
    out = str(tmp_path / "v.npy")
    first = ResumableOutput(out, {**JOB, "model": identity("A").to_json()})
    first.open()
    first.write(plan_chunks([1] * 4, 2, 10)[0], np.ones((2, DIM), dtype=np.float32))
    first.close()
    journal = (tmp_path / "v.npy.journal").read_bytes()
    slightly_off = ModelIdentity("ensemble", DIM, tuple(v + 1e-4 for v in identity("A").fingerprint))
    same = ResumableOutput(out, {**JOB, "model": slightly_off.to_json()})  # same model, another device
    assert same.open() == {0}
    same.close()
    with pytest.raises(ModelMismatch, match=r"v.npy.journal was written with model ensemble \(48 dimensions"):
        ResumableOutput(out, {**JOB, "model": identity("B").to_json()}).open()
    assert (tmp_path / "v.npy.journal").read_bytes().startswith(journal)


def test_a_second_lock_fails_at_once_naming_the_holder(tmp_path):
    out = str(tmp_path / "v.npy")
    with OutputLock(out) as first:
        assert first.stale_holder == ""
        with pytest.raises(OutputLocked, match=rf"v.npy.lock: another run \(pid {os.getpid()} on .*\) is writing"):
            OutputLock(out).acquire()
    assert not os.path.exists(out + ".lock")
    with OutputLock(out):  # released: free again
        pass


def test_the_lock_of_a_dead_run_is_taken_over(tmp_path):
    out = str(tmp_path / "v.npy")
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom rose_client.store import OutputLock\n"
                               f"lock = OutputLock({out!r}).acquire()\nprint('locked', flush=True)\nsys.stdin.read()"],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(OutputLocked, match=f"pid {holder.pid} "):
            OutputLock(out).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert os.path.exists(out + ".lock")  # left behind by the killed run
    with OutputLock(out) as lock:
        assert lock.stale_holder.startswith(f"pid {holder.pid} ")


def bulk_args(tmp_path, *urls):
    args = [str(tmp_path / "in.txt"), str(tmp_path / "out.npy"), "--max-chunk-texts", "2", "--no-progress"]
    return args + [a for url in urls for a in ("--url", url)]


def test_bulk_refuses_to_resume_against_another_model(replicas, tmp_path, monkeypatch, capsys):
    (tmp_path / "in.txt").write_text("".join(f"text {i}\n" for i in range(8)))
    replicas.update({"a:1": "A", "b:1": "B"})
    written = []
    real_write = ResumableOutput.write

    def write_two_then_fail(self, chunk, rows):
        if len(written) == 2:
            raise OSError("no space left on device")
        written.append(chunk.index)
        real_write(self, chunk, rows)

    monkeypatch.setattr(ResumableOutput, "write", write_two_then_fail)
    with pytest.raises(OSError, match="no space left"):
        bulk.main(bulk_args(tmp_path, "a:1"))
    monkeypatch.setattr(ResumableOutput, "write", real_write)
    kept = {name: (tmp_path / name).read_bytes() for name in ("out.npy.journal", "out.npy.partial.npy")}
    capsys.readouterr()
    assert bulk.main(bulk_args(tmp_path, "b:1")) == 2
    assert "error: ModelMismatch: " in capsys.readouterr().err
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept
    assert bulk.main(bulk_args(tmp_path, "a:1", "b:1")) == 2
    assert "error: ModelMismatch: replicas serve different models" in capsys.readouterr().err
    assert bulk.main(bulk_args(tmp_path, "a:1")) == 0
    assert "resuming: 2 of 4 chunks already done" in capsys.readouterr().err
    expected = np.stack([vector("A", f"text {i}".encode()) for i in range(8)])
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.npy"]


@pytest.mark.parametrize("flag, sent", [([], "batch"), (["--priority", "interactive"], "interactive")])
def test_bulk_sends_its_chunks_as_batch_work_by_default(replicas, tmp_path, flag, sent):
    (tmp_path / "in.txt").write_text("".join(f"text {i}\n" for i in range(6)))
    replicas.update({"a:1": "A"})
    assert bulk.main(bulk_args(tmp_path, "a:1") + flag) == 0
    jobs = [parameters for texts, parameters in SENT if texts != [PROBE_TEXT.encode()]]
    assert len(jobs) == 3 and all(p["priority_class"] == sent for p in jobs)


def test_bulk_fails_at_once_on_a_locked_output(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("one\n")
    with OutputLock(str(tmp_path / "out.npy")):
        assert bulk.main(bulk_args(tmp_path, "127.0.0.1:1")) == 2  # no replica is contacted
    err = capsys.readouterr().err
    assert "error: OutputLocked: " in err and "out.npy.lock: another run (pid" in err

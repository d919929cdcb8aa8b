"""EmbeddingClient over in-process replicas: the real dispatcher and stream slots,
a fake gRPC connection (the real servers: tests/e2e/test_client_e2e.py)."""
import asyncio

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor

import rose_client.client
from rose_client import EmbeddingClient

TEXTS = [f"t{i}" for i in range(50)]


class FakeChannel:
    """Stands in for a replica's ReplicaChannel: each stream answers TEXT ["t<i>", ...]
    with EMBEDDINGS [[i], ...], in order."""

    opened: dict = {}

    def __init__(self, url):
        self.url, self.client, self.generation, self.slots = url, self, 0, []
        self.requests = []
        FakeChannel.opened[url] = self

    def stream_infer(self, requests):
        channel = self

        class Stream:
            async def __anext__(self):
                request = await requests.__anext__()
                channel.requests.append(request)
                (text,) = request["inputs"]
                rows = [[float(t[1:])] for t in deserialize_bytes_tensor(text._get_content())]

                class Result:
                    def as_numpy(self, name):
                        return np.array(rows, dtype=np.float32) if name == "EMBEDDINGS" else None

                return Result(), None

            def cancel(self):
                pass

        return Stream()

    async def is_ready(self, model=None):
        return True

    async def close(self):
        pass


@pytest.fixture
def client(monkeypatch):
    FakeChannel.opened = {}
    monkeypatch.setattr(rose_client.client, "ReplicaChannel", FakeChannel)
    return EmbeddingClient(["a:1", "b:1"], max_chunk_texts=4, max_inflight_per_replica=2)


def test_a_resumed_job_gets_each_missing_chunk_once_with_progress(client):
    chunks = client.plan(TEXTS)
    todo = chunks[3:]  # chunks 0-2 were done by an earlier run
    texts_done = sum(c.num_texts for c in chunks[:3])
    delivered, progress = {}, []

    def keep(chunk, rows):
        assert chunk.index not in delivered
        delivered[chunk.index] = rows

    client.run(TEXTS, todo, keep, {"dimensions": 8}, lambda done, total: progress.append((done, total)),
               texts_done=texts_done)
    assert sorted(delivered) == [c.index for c in todo]
    for chunk in todo:
        np.testing.assert_array_equal(delivered[chunk.index][:, 0], np.arange(chunk.start, chunk.stop))
    assert [total for _, total in progress] == [len(TEXTS)] * len(todo)
    assert progress[0][0] > texts_done and progress[-1][0] == len(TEXTS)
    requests = [r for channel in FakeChannel.opened.values() for r in channel.requests]
    assert len(requests) == len(todo) and all(r["parameters"] == {"dimensions": 8} for r in requests)
    assert set(FakeChannel.opened) == {"a:1", "b:1"}
    assert sum(r.completed_chunks for r in client.last_dispatcher.tasks.replicas.values()) == len(todo)


def test_embed_works_from_inside_a_running_event_loop(client):
    async def notebook_cell():
        return client.embed(TEXTS)

    rows = asyncio.run(notebook_cell())
    np.testing.assert_array_equal(rows[:, 0], np.arange(len(TEXTS)))


def test_an_error_in_the_callers_callback_ends_the_job(client):
    def full_disk(chunk, rows):
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space left"):
        client.run(TEXTS, client.plan(TEXTS), full_disk)

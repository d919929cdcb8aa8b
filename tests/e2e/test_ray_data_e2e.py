"""rose_client.ray_data.RoseEmbedder on a local Ray instance (ray.init(num_cpus=2)) against two real
replicas: a Parquet folder embedded into a Parquet folder, rows equal to direct calls, ids and
order kept; replica B killed while it holds chunks of the run: nothing lost, nothing doubled.
The run is held between batches by a gate file this test controls, and B holds its chunks by
its encoder's test-only hold (testing/hold.py): no timing decides what is in flight."""
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rose_triton.faults import wait_at_gate
from rose_triton.server import TritonServer
from testing import REPO
from testing.embed_clients import embed_stream
from testing.hold import EncoderHold, wait_for_metric_zero
from testing.reliability_helpers import metric_value
from testing.waiting import wait_until

ray = pytest.importorskip("ray", reason="Ray (requirements-test.lock) is not installed")

NUM_TEXTS, BATCH = 96, 24


def texts():
    return [f"passage {i}: the {'quick ' * (i % 9)}brown fox number {i} jumps" for i in range(NUM_TEXTS)]


@pytest.fixture(scope="module")
def replica_b(tmp_path_factory):
    """A second replica of this module's own (the test kills it), with the encoder's hold;
    Ray starts while it comes up."""
    folder = tmp_path_factory.mktemp("ray_replica_b")
    hold = EncoderHold(folder)
    started = {}
    thread = threading.Thread(target=lambda: started.setdefault("b", TritonServer(folder / "server.log",
                                                                                  env=hold.env)), daemon=True)
    thread.start()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    thread.join()
    if "b" not in started:
        pytest.fail(f"replica B did not start; log: {folder / 'server.log'}")
    started["b"].hold = hold
    yield started["b"]
    ray.shutdown()
    started["b"].kill()


def gate(batch, path: str):
    """A Ray stage that holds every batch after the first while `path` exists (touching
    `path.entered`): the test decides when the run goes on."""
    if int(np.min(batch["n"])) > 0:
        wait_at_gate(path, f"{path}.entered")
    return batch


def test_through_the_gateway_rows_equal_direct_calls(server):
    """The gateway mode on one batch, numpy and pandas alike (Ray hands either), without Ray."""
    import pandas as pd

    from rose_client.ray_data import RoseEmbedder

    embedder = RoseEmbedder(gateway=server.gateway_url, max_chunk_texts=7)
    ids = np.array([f"doc-{i}" for i in range(20)])
    batch = embedder({"id": ids, "text": np.array(texts()[:20])})
    expected = embed_stream(server.grpc_url, texts()[:20])
    rows = np.stack(batch["embedding"])
    assert list(batch["id"]) == list(ids) and rows.shape == expected.shape
    assert ((rows * expected).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(expected, axis=1)).min() >= 0.9999
    frame = embedder(pd.DataFrame({"id": ids[:3], "text": texts()[:3]}))
    np.testing.assert_allclose(np.stack(frame["embedding"]), rows[:3], atol=1e-6)
    with pytest.raises(ValueError, match="either"):
        RoseEmbedder(urls=[server.grpc_url], gateway=server.gateway_url)


def test_parquet_folder_to_parquet_folder_survives_a_replica_killed_mid_run(server, replica_b, tmp_path):
    source, target, gate_file = tmp_path / "docs", tmp_path / "vectors", tmp_path / "gate"
    source.mkdir()
    ids = [f"doc-{i:03d}" for i in range(NUM_TEXTS)]
    for part in range(2):  # a folder of two files
        half = slice(part * NUM_TEXTS // 2, (part + 1) * NUM_TEXTS // 2)
        pq.write_table(pa.table({"id": ids[half], "text": texts()[half], "n": list(range(NUM_TEXTS))[half]}),
                       source / f"part-{part}.parquet")
    gate_file.touch()
    from ray.data import DataContext

    from rose_client.ray_data import RoseEmbedder

    DataContext.get_current().execution_options.preserve_order = True
    ds = ray.data.read_parquet(str(source)).map_batches(gate, fn_kwargs={"path": str(gate_file)}, batch_size=BATCH)
    ds = ds.map_batches(RoseEmbedder, fn_constructor_kwargs={"urls": [server.grpc_url, replica_b.grpc_url],
                                                             "max_chunk_texts": 4},
                        concurrency=1, batch_size=BATCH)
    failure = []
    run = threading.Thread(target=lambda: _capture(failure, lambda: ds.write_parquet(str(target))))
    run.start()
    try:
        wait_until(lambda: Path(f"{gate_file}.entered").exists() or not run.is_alive(), 240,
                   "the run to pass its first batch and reach the gate")
        assert run.is_alive(), failure
        with replica_b.hold:  # B keeps the chunks it gets of the next batch
            wait_for_metric_zero(replica_b.metrics_url, "rose_queue_sequences{", why="(on B, before the next batch)")
            gate_file.unlink()
            wait_until(lambda: metric_value(replica_b.metrics_url, "rose_queue_sequences{") >= 1, 120,
                       "a chunk of the run to wait in replica B")
            replica_b.kill()  # SIGKILL: its chunks are lost there and retried on A
    finally:
        gate_file.unlink(missing_ok=True)
        run.join(300)
    assert not run.is_alive() and not failure, failure
    table = pq.read_table(target).to_pydict()
    assert table["id"] == ids and table["n"] == list(range(NUM_TEXTS))  # every row once, in order
    rows = np.array(table["embedding"], dtype=np.float32)
    expected = embed_stream(server.grpc_url, texts())
    cosine = (rows * expected).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(expected, axis=1)
    assert rows.shape == expected.shape and cosine.min() >= 0.9999


def _capture(failure: list, work) -> None:
    try:
        work()
    except BaseException as exc:  # the test reads it after the join
        failure.append(repr(exc))

"""The Batch API against the session's real tritonserver, through the official `openai` SDK: the
whole flow (files.create, batches.create, batches.retrieve, files.content), rows equal to direct
calls and to sentence-transformers, lines at the `batch` class, keys that see only their own;
a gateway killed mid-job and restarted completes the job with every custom_id once, as does
the second of two gateways sharing one data folder when the first, running the job, is killed;
a cancel mid-job leaves a partial output; bad lines of every kind are error lines beside good
rows; outputs are deleted once the app's clock passes `output_expires_after`.
The job is held between lines by the runner's test-only gate (testing/hold.py), never by time."""
import asyncio
import json
import time
import urllib.request

import httpx
import numpy as np
import openai
import pytest

from engine_lib.runner.self_check import MIN_COSINE
from gateway.app import create_app
from gateway.config import GatewayConfig
from testing.gateway_process import GatewayProcess
from testing.hold import BatchLineHold
from testing.waiting import wait_until, wait_until_async

MODEL = "all-MiniLM-L6-v2"
KEYS = ("batch-key-a", "batch-key-b")
TERMINAL = ("completed", "failed", "expired", "cancelled")
# A killed runner's job is taken over after this; short for the tests, long enough that a runner of a
# loaded machine whose renewals stall a few seconds keeps its job.
LEASE_S = 4


def batch_class(server, metric: str) -> float:
    """The server's `metric` summed over its batch-class series."""
    page = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith(metric + "{") and 'priority="batch"' in line)


def submit_with_a_line_queued(server, client, lines):
    """Under the encoder's hold: submit `lines`, then wait until a line of the job waits in the encoder.
    The gauge is seen at 0 first (nothing of the batch class is queued before the submit): it is
    published every 0.5 s, and a value left from an earlier job would let the test hold the runner
    before it starts any line, with nothing in flight."""
    wait_until(lambda: batch_class(server, "rose_queue_sequences") == 0, 60,
               "the encoder's batch class to read empty before the job")
    batch = submit(client, lines)
    wait_until(lambda: batch_class(server, "rose_queue_sequences") >= 1, 60,
               "a line of the job to wait in the encoder at the batch class")
    return batch


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


class BatchGateway:
    """A gateway of this module's own (it is killed and started again) beside the session's server,
    with two API keys, a data folder (`data`: one other gateways share) and the runner's gate."""

    def __init__(self, server, folder, data=None):
        self.server, self.folder, self.starts = server, folder, 0
        self.data = data or folder / "data"
        (folder / "gates").mkdir(parents=True)
        self.hold = BatchLineHold(folder / "gates")
        self.process = self.start()

    def start(self) -> GatewayProcess:
        self.starts += 1
        self.process = GatewayProcess(self.folder / f"gateway-{self.starts}.log", [self.server.grpc_url],
                                      args=["--data-dir", str(self.data), "--batch-lease", str(LEASE_S)],
                                      env={"ROSE_GATEWAY_API_KEYS": ",".join(KEYS), **self.hold.env})
        return self.process

    def client(self, key=KEYS[0]) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.process.url}/v1", api_key=key, max_retries=0)

    def kill(self) -> None:
        """SIGKILL: no lease released, nothing flushed by the gateway."""
        self.process.process.kill()
        self.process.process.wait()

    def stop(self) -> None:
        self.hold.release()
        self.process.stop()


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    instance = BatchGateway(server, tmp_path_factory.mktemp("batch_gateway"))
    yield instance
    instance.stop()


def jsonl(lines) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def embedding_line(custom_id, texts, **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": texts, "encoding_format": "float", **body}}


def submit(client, lines, endpoint="/v1/embeddings"):
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                 metadata={"test": "batch_e2e"})


def finished(client, batch_id, timeout=120):
    return wait_until(lambda: (b := client.batches.retrieve(batch_id)).status in TERMINAL and b, timeout,
                      f"batch {batch_id} to finish", 0.05)


def results(client, file_id) -> dict:
    if file_id is None:
        return {}
    rows = [json.loads(line) for line in client.files.content(file_id).content.splitlines()]
    by_id = {row["custom_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a custom_id answered twice"
    return by_id


def texts_for(i):
    return [f"document {i} about topic {i % 7}", f"a second passage for line {i} " * (1 + i % 5)]



def assert_completed_as_direct_calls(client, batch_id, lines, checked):
    """The job completed with every line once, and the `checked` lines' rows equal direct calls."""
    done = finished(client, batch_id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == \
        (len(lines), len(lines), 0)
    rows = results(client, done.output_file_id)
    assert sorted(rows) == sorted(line["custom_id"] for line in lines)
    for line in checked:
        direct = client.embeddings.create(**line["body"])
        got = rows[line["custom_id"]]["response"]["body"]["data"]
        assert cosine([d["embedding"] for d in got], [d.embedding for d in direct.data]).min() >= 0.9999

def test_sdk_flow_rows_equal_direct_calls_and_keys_see_only_their_own(gateway, server, reference_model):
    client, other = gateway.client(), gateway.client(KEYS[1])
    lines = [embedding_line(f"req-{i}", texts_for(i)) for i in range(6)]
    lines.append(embedding_line("req-dims", texts_for(9), dimensions=64))
    batch_tokens = batch_class(server, "rose_priority_tokens_total")
    batch = submit(client, lines)
    assert batch.status == "validating" and batch.metadata == {"test": "batch_e2e"}
    done = finished(client, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 7, 0)
    rows = results(client, done.output_file_id)
    assert sorted(rows) == sorted(line["custom_id"] for line in lines)
    usage = 0
    for line in lines:
        answer = rows[line["custom_id"]]["response"]
        assert answer["status_code"] == 200 and rows[line["custom_id"]]["error"] is None
        got = np.array([d["embedding"] for d in answer["body"]["data"]])
        direct = client.embeddings.create(**{k: v for k, v in line["body"].items()})
        assert cosine(got, [d.embedding for d in direct.data]).min() >= 0.9999
        usage += answer["body"]["usage"]["prompt_tokens"]
        if "dimensions" not in line["body"]:
            assert cosine(got, reference_model.encode(line["body"]["input"], normalize_embeddings=True)).min() \
                >= MIN_COSINE
    # the job's tokens ran at the batch class (its lines are small: alone they would be interactive);
    # the encoder publishes its counters every 0.5 s, so the last lines' tokens may show a little later
    wait_until(lambda: batch_class(server, "rose_priority_tokens_total") - batch_tokens >= usage, 60,
               f"the job's {usage} tokens to be counted at the batch class", 0.05)
    assert done.id in [b.id for b in client.batches.list()]
    assert {done.input_file_id, done.output_file_id} <= {f.id for f in client.files.list()}
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    for call in (lambda: other.batches.retrieve(done.id), lambda: other.files.content(done.output_file_id),
                 lambda: other.files.retrieve(done.input_file_id), lambda: other.batches.cancel(done.id),
                 lambda: other.files.delete(done.output_file_id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert not {f.id for f in other.files.list()} & {done.input_file_id, done.output_file_id}
    with pytest.raises(openai.ConflictError):  # completed: nothing to cancel
        client.batches.cancel(done.id)
    assert client.files.delete(done.output_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(done.output_file_id)


def test_bad_lines_of_every_kind_are_error_lines_beside_good_rows(gateway):
    client = gateway.client()
    good = [embedding_line(f"good-{i}", texts_for(i)) for i in range(3)]
    bad = {
        None: b"{this is not json",
        "wrong-method": {**embedding_line("wrong-method", ["x"]), "method": "GET"},
        "wrong-url": {**embedding_line("wrong-url", ["x"]), "url": "/v1/chat/completions"},
        "no-body": {"custom_id": "no-body", "method": "POST", "url": "/v1/embeddings"},
        "unknown-model": embedding_line("unknown-model", ["x"], model="no-such-model"),
        "unknown-field": embedding_line("unknown-field", ["x"], temperature=1),
        "empty-input": embedding_line("empty-input", []),
        "bad-dimensions": embedding_line("bad-dimensions", ["x"], dimensions=100000),
    }
    lines = [good[0], *bad.values(), good[1], embedding_line("good-0", ["a duplicate custom_id"]), good[2]]
    done = finished(client, submit(client, lines).id)
    assert done.status == "completed"
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (len(lines), 3, len(lines) - 3)
    rows, errors = results(client, done.output_file_id), results(client, done.error_file_id)
    assert sorted(rows) == ["good-0", "good-1", "good-2"]
    assert all(rows[k]["response"]["body"]["data"][0]["embedding"] for k in rows)
    assert set(errors) == set(bad) | {"good-0"}
    assert errors[None]["error"]["code"] == "invalid_json" and errors[None]["response"] is None
    assert errors["good-0"]["error"]["code"] == "duplicate_custom_id"
    assert errors["wrong-method"]["error"]["code"] == "invalid_method"
    assert errors["wrong-url"]["error"]["code"] == "invalid_url"
    assert errors["no-body"]["error"]["code"] == "invalid_body"
    for custom_id, status, param in (("unknown-model", 404, "model"), ("unknown-field", 400, "temperature"),
                                     ("empty-input", 400, "input"), ("bad-dimensions", 400, "dimensions")):
        response = errors[custom_id]["response"]
        assert response["status_code"] == status and response["body"]["error"]["param"] == param, response


def test_cohere_lines_equal_direct_calls(gateway):
    client = gateway.client()
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v2/embed",
              "body": {"model": MODEL, "texts": texts_for(i), "input_type": "search_query",
                       "embedding_types": ["float", "int8"]}} for i in range(3)]
    done = finished(client, submit(client, lines, "/v2/embed").id)
    assert done.status == "completed" and done.request_counts.completed == 3
    rows = results(client, done.output_file_id)
    http = client.with_options(base_url=gateway.process.url)
    for line in lines:
        direct = http.post("/v2/embed", body=line["body"], cast_to=object)
        got = rows[line["custom_id"]]["response"]["body"]["embeddings"]
        assert cosine(got["float"], direct["embeddings"]["float"]).min() >= 0.9999
        assert np.abs(np.array(got["int8"]) - np.array(direct["embeddings"]["int8"])).max() <= 1


def test_killed_mid_job_the_restarted_gateway_completes_it_exactly_once(gateway, server):
    client = gateway.client()
    lines = [embedding_line(f"k{i}", texts_for(i)) for i in range(30)]
    batch, _, _ = hold_a_job_mid_run(server, client, lines, [gateway.hold])
    try:
        gateway.kill()
        gateway.hold.entered.unlink()
        gateway.start()
        gateway.hold.wait_entered()  # the new gateway took the job over (the old lease expired) and holds
        client = gateway.client()
        assert client.batches.retrieve(batch.id).status == "in_progress"
    finally:
        gateway.hold.release()
    assert_completed_as_direct_calls(client, batch.id, lines, lines[::7])


def test_cancel_mid_job_leaves_a_partial_output(gateway, server):
    client = gateway.client()
    lines = [embedding_line(f"x{i}", texts_for(i)) for i in range(30)]
    with server.hold:
        batch = submit_with_a_line_queued(server, client, lines)
        gateway.hold.__enter__()
        assert client.batches.cancel(batch.id).status == "cancelling"
    gateway.hold.wait_entered()
    gateway.hold.release()
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    rows = results(client, done.output_file_id)
    counts = done.request_counts
    assert 0 < counts.completed == len(rows) < len(lines) and counts.failed == 0 and counts.total == len(lines)
    assert set(rows) <= {line["custom_id"] for line in lines}


def hold_a_job_mid_run(server, client, lines, holds):
    """Submit `lines`; once some are in flight, hold the runners at their gates (`holds`) and let
    the lines in flight finish. -> (batch, the hold its runner waits at, lines written)."""
    with server.hold:  # lines reach the encoder and wait there
        batch = submit_with_a_line_queued(server, client, lines)
        for hold in holds:
            hold.__enter__()  # no line starts after those in flight
    holding = wait_until(lambda: [hold for hold in holds if hold.entered.exists()], 60,
                         "the job's runner to reach its hold")
    assert len(holding) == 1, "two runners run the job"
    done_before = wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed, 60,
                             "the lines in flight to be written")
    assert 0 < done_before < len(lines)
    return batch, holding[0], done_before


def test_two_replicas_share_the_jobs_and_one_takes_over_the_job_of_a_killed_one(server, tmp_path):
    data = tmp_path / "shared-data"
    replicas = [BatchGateway(server, tmp_path / name, data) for name in ("replica-1", "replica-2")]
    try:
        client = replicas[0].client()
        lines = [embedding_line(f"r{i}", texts_for(i)) for i in range(30)]
        batch, holding, done_before = hold_a_job_mid_run(server, client, lines, [r.hold for r in replicas])
        runner, survivor = sorted(replicas, key=lambda r: r.hold is not holding)
        survivor_client = survivor.client()
        assert survivor_client.batches.retrieve(batch.id).status == "in_progress"  # the folder's jobs are shared
        assert not survivor.hold.entered.exists()  # the lease is held: the other runner stays off the job
        runner.kill()
        survivor.hold.wait_entered()  # the lease expired; the survivor took the job over and holds
        resumed = survivor_client.batches.retrieve(batch.id)
        assert resumed.status == "in_progress" and resumed.request_counts.completed >= done_before
        survivor.hold.release()
        assert_completed_as_direct_calls(survivor_client, batch.id, lines, lines)
    finally:
        for replica in replicas:
            replica.stop()


def test_outputs_past_output_expires_after_are_deleted(server, tmp_path):
    """The gateway's app in this process (its runner too) against the session's server, its Batch
    API's clock moved by the test: no wait on wall time."""
    now = [time.time()]
    config = GatewayConfig(triton=(server.grpc_url,), data_dir=str(tmp_path / "data"), api_keys=frozenset(KEYS))
    app = create_app(config, clock=lambda: now[0])
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    lines = [embedding_line("kept-1", texts_for(1)), embedding_line("kept-2", texts_for(2)), b"{not json"]

    async def scenario():
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=headers) as http:
            uploaded = (await http.post("/v1/files", files={"file": ("in.jsonl", jsonl(lines))},
                                        data={"purpose": "batch"})).json()
            created = await http.post("/v1/batches", json={
                "input_file_id": uploaded["id"], "endpoint": "/v1/embeddings", "completion_window": "24h",
                "output_expires_after": {"anchor": "created_at", "seconds": 3600}})
            batch = created.json()

            async def status():
                return (await http.get(f"/v1/batches/{batch['id']}")).json()
            done = await wait_until_async(status, lambda b: b["status"] in TERMINAL, 120, "the batch to finish",
                                          0.05)
            assert done["status"] == "completed" and done["request_counts"]["completed"] == 2
            outputs = (done["output_file_id"], done["error_file_id"])
            for file_id in outputs:
                described = (await http.get(f"/v1/files/{file_id}")).json()
                assert described["expires_at"] == batch["created_at"] + 3600
                assert (await http.get(f"/v1/files/{file_id}/content")).status_code == 200
            now[0] = batch["created_at"] + 3599  # a second before: still there
            assert {f["id"] for f in (await http.get("/v1/files")).json()["data"]} >= set(outputs)
            now[0] = batch["created_at"] + 3600
            listed = {f["id"] for f in (await http.get("/v1/files")).json()["data"]}
            assert uploaded["id"] in listed and not listed & set(outputs)  # the input has no expiry
            for file_id in outputs:
                for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
                    gone = await http.get(path)
                    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
                assert not (tmp_path / "data" / "files" / file_id).exists()
            assert (await http.get(f"/v1/files/{uploaded['id']}/content")).content == jsonl(lines)

    asyncio.run(scenario())

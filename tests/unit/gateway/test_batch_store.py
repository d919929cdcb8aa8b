"""The Batch API's store, lines and runner without a server: ownership, limits, pages, the lease
between two runners, a job resumed after its runner died (every line once), cancel and expiry."""
import asyncio
import time

import orjson
import pytest

from gateway.batch import uploads
from gateway.batch.lines import done_lines, read_requests
from gateway.batch.runner import BatchRunner, JobRun, RunnerSettings
from gateway.batch.store import BatchStore, Limits
from gateway.errors import ApiError

ENDPOINT = "/v1/embeddings"


def request_line(custom_id, text="hello", url=ENDPOINT, **extra):
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                         "body": {"model": "m", "input": text}, **extra})


def add_input(store, tmp_path, lines, owner="alice", name="in.jsonl"):
    source = tmp_path / name
    source.write_bytes(b"\n".join(lines) + b"\n")
    return store.add_file(owner, source, name, "batch", source.stat().st_size)


def new_batch(store, file_id, owner="alice", window_s=3600, expires_after=None):
    return store.create_batch(owner, ENDPOINT, file_id, window_s, "24h", {"k": "v"}, expires_after)


@pytest.fixture
def store(tmp_path):
    return BatchStore(tmp_path / "data", Limits(max_files_per_key=3, max_active_batches_per_key=2))


def test_files_are_owned_listed_in_pages_and_deleted(store, tmp_path):
    first = add_input(store, tmp_path, [request_line("a")], name="1.jsonl")
    second = add_input(store, tmp_path, [request_line("b")], name="2.jsonl")
    assert store.file("alice", first["id"])["filename"] == "1.jsonl"
    assert store.file_path(first["id"]).read_bytes() == request_line("a") + b"\n"
    with pytest.raises(ApiError) as other:
        store.file("bob", first["id"])
    assert other.value.status == 404
    page, more = store.list_files("alice", None, 1, "desc", None)
    assert [f["id"] for f in page] == [second["id"]] and more
    page, more = store.list_files("alice", "batch", 5, "desc", second["id"])
    assert [f["id"] for f in page] == [first["id"]] and not more
    assert store.list_files("bob", None, 5, "asc", None) == ([], False)
    with pytest.raises(ApiError):
        store.delete_file("bob", first["id"])
    assert store.delete_file("alice", first["id"])["deleted"]
    assert not store.file_path(first["id"]).exists()


def test_limits_name_what_is_full(store, tmp_path):
    files = [add_input(store, tmp_path, [request_line(str(i))], name=f"{i}.jsonl") for i in range(3)]
    with pytest.raises(ApiError) as full:
        add_input(store, tmp_path, [request_line("x")], name="x.jsonl")
    assert full.value.status == 429 and "at most 3" in full.value.message
    new_batch(store, files[0]["id"])
    new_batch(store, files[0]["id"])
    with pytest.raises(ApiError) as busy:
        new_batch(store, files[0]["id"])
    assert busy.value.status == 429 and "unfinished batches" in busy.value.message
    with pytest.raises(ApiError) as theirs:
        new_batch(store, files[1]["id"], owner="bob")
    assert theirs.value.status == 404


def test_expired_files_are_deleted(store, tmp_path):
    kept = add_input(store, tmp_path, [request_line("a")], name="a.jsonl")
    gone = add_input(store, tmp_path, [request_line("b")], name="b.jsonl")
    store.set_file_expiry(gone["id"], int(time.time()) - 1)
    assert store.delete_expired_files() == 1
    assert store.file("alice", kept["id"])
    with pytest.raises(ApiError):
        store.file("alice", gone["id"])
    assert not store.file_path(gone["id"]).exists()


def test_one_runner_holds_a_lease_until_it_expires(store, tmp_path):
    batch = new_batch(store, add_input(store, tmp_path, [request_line("a")])["id"])
    assert store.claim("r1", 60)[1]["id"] == batch["id"]
    assert store.claim("r2", 60) is None  # held
    assert store.renew(batch["id"], "r1", 60) == "validating"
    assert store.renew(batch["id"], "r2", 60) is None
    store.release(batch["id"], "r1")
    assert store.claim("r2", -1)[1]["id"] == batch["id"]  # a lease that is already over
    assert store.claim("r3", 60)[1]["id"] == batch["id"]  # taken over
    assert store.renew(batch["id"], "r2", 60) is None
    assert store.update(batch["id"], "r2", {"status": "in_progress"}) is None


def test_bad_lines_are_errors_and_the_rest_requests(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([request_line("ok"), b"{not json", b"[1]", b'{"method": "POST"}', request_line("ok"),
                                 request_line("get", method="GET"), request_line("url", url="/v1/rerank"),
                                 orjson.dumps({"custom_id": "nobody", "method": "POST", "url": ENDPOINT}),
                                 request_line("big", "x" * 200), request_line("extra", extra=1), b"   "]))
    lines = list(read_requests(path, ENDPOINT, 150))
    assert [line.error[0] if line.error else None for line in lines] == [
        None, "invalid_json", "invalid_request", "missing_custom_id", "duplicate_custom_id", "invalid_method",
        "invalid_url", "invalid_body", "request_too_large", "invalid_request"]
    assert [line.number for line in lines] == list(range(1, 11))
    assert orjson.loads(lines[0].body) == {"model": "m", "input": "hello"}


def test_multipart_upload_is_split_on_disk(tmp_path):
    body = tmp_path / "body"
    content = b'{"a": 1}\r\n--not-the-boundary\n' * 3
    body.write_bytes(b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                     b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
                     b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--XyZ--\r\n")
    form = uploads.split_form(body, 'multipart/form-data; boundary="XyZ"', tmp_path / "file")
    assert form.fields == {"purpose": "batch"} and form.filename == "in.jsonl"
    assert (tmp_path / "file").read_bytes() == content and form.file_bytes == len(content)
    assert uploads.count_lines(tmp_path / "file") == 6
    with pytest.raises(ApiError, match="multipart/form-data"):
        uploads.split_form(body, "application/json", tmp_path / "file")
    body.write_bytes(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\ncut")
    with pytest.raises(ApiError, match="cut short"):
        uploads.split_form(body, "multipart/form-data; boundary=XyZ", tmp_path / "file")


class Answers:
    """The call a runner is given: each body answered with its input echoed, 400 for input 'bad';
    `gate` (when set) holds every call until the test opens it."""

    def __init__(self):
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, path: str, body: bytes) -> tuple[int, bytes]:
        text = orjson.loads(body)["input"]
        self.calls.append(text)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if text == "bad":
            return 400, b'{"error":{"message":"bad input"}}'
        return 200, orjson.dumps({"echo": text})


def read_results(store, file_id):
    return [orjson.loads(line) for line in store.file_path(file_id).read_bytes().splitlines()]


def run_job(store, runner_id, call, settings=RunnerSettings(concurrency=2, lease_s=60)):
    runner = BatchRunner(store, call, settings)
    runner.id = runner_id
    claimed = store.claim(runner.id, settings.lease_s)
    return runner, JobRun(runner, *claimed)


def test_a_job_resumed_after_its_runner_died_answers_every_line_once(store, tmp_path):
    texts = [f"text {i}" for i in range(12)]
    lines = [request_line(f"id-{i}", t) for i, t in enumerate(texts)] + [b"{oops", request_line("bad", "bad")]
    batch = new_batch(store, add_input(store, tmp_path, lines)["id"], expires_after=7200)

    async def first_runner():
        answers = Answers()
        runner, job = run_job(store, "dead", answers)
        task = asyncio.create_task(job.run())
        while answers.calls.count("text 5") == 0:  # it is past the first lines
            await asyncio.sleep(0)
        answers.gate = asyncio.Event()  # the next calls never answer: the runner dies with them in flight
        answers.entered.clear()
        await answers.entered.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return answers

    asyncio.run(first_runner())
    partial = done_lines(store.work_dir / batch["id"] / "output.jsonl")
    assert 0 < len(partial) < len(texts)
    with open(store.work_dir / batch["id"] / "output.jsonl", "ab") as f:
        f.write(b'{"id": "batch_req_cut')  # the dead runner was in the middle of a line
    answers = Answers()  # the stopped runner released its lease: the next one takes the job at once
    _, job = run_job(store, "next", answers)
    asyncio.run(job.run())
    assert not {f"text {i}" for i in range(12) if i + 1 in partial} & set(answers.calls)
    done = store.batch("alice", batch["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 14, "completed": 12, "failed": 2}
    output = read_results(store, done["output_file_id"])
    assert sorted(r["custom_id"] for r in output) == sorted(f"id-{i}" for i in range(12))
    assert all(r["response"]["body"] == {"echo": texts[int(r["custom_id"][3:])]} for r in output)
    errors = {r["custom_id"]: r for r in read_results(store, done["error_file_id"])}
    assert errors["bad"]["response"]["status_code"] == 400 and errors[None]["error"]["code"] == "invalid_json"
    with pytest.raises(ApiError) as late:
        store.cancel("alice", batch["id"])
    assert late.value.status == 409 and "completed" in late.value.message
    output_file = store.file("alice", done["output_file_id"])
    assert output_file["purpose"] == "batch_output" and output_file["expires_at"] == batch["created_at"] + 7200


def test_cancel_mid_job_keeps_what_is_done(store, tmp_path):
    lines = [request_line(f"id-{i}", f"text {i}") for i in range(10)]
    batch = new_batch(store, add_input(store, tmp_path, lines)["id"])

    async def scenario():
        answers = Answers()
        _, job = run_job(store, "r", answers, RunnerSettings(concurrency=1, lease_s=0.2))
        answers.gate = asyncio.Event()
        task = asyncio.create_task(job.run())
        await answers.entered.wait()  # line 1 in flight, the rest not started
        assert store.cancel("alice", batch["id"])["status"] == "cancelling"
        while not job.stop:  # the runner's tick sees the cancel
            await asyncio.sleep(0.01)
        answers.gate.set()
        await task
        return answers

    answers = asyncio.run(scenario())
    done = store.batch("alice", batch["id"])
    assert done["status"] == "cancelled" and done["cancelled_at"] and answers.calls == ["text 0"]
    assert done["request_counts"] == {"total": 10, "completed": 1, "failed": 0}
    assert [r["custom_id"] for r in read_results(store, done["output_file_id"])] == ["id-0"]
    assert store.cancel("alice", batch["id"])["status"] == "cancelled"  # again: as it is


def run_with_a_late_tick(store, batch_id, while_in_flight):
    """Run the job's one line; while it is in flight the runner's trust in its lease lapses (its
    tick late, as on a loaded machine) and `while_in_flight` runs. -> the job."""
    async def scenario():
        answers = Answers()
        _, job = run_job(store, "r", answers, RunnerSettings(concurrency=1, lease_s=60))
        answers.gate = asyncio.Event()
        task = asyncio.create_task(job.run())
        await answers.entered.wait()
        job.trusted_until = time.monotonic() - 1  # the last renewal is too old to trust
        while_in_flight()
        answers.gate.set()
        await task
        return job

    return asyncio.run(scenario())


def test_a_runner_whose_tick_is_late_renews_and_keeps_its_answers(store, tmp_path):
    batch = new_batch(store, add_input(store, tmp_path, [request_line("only", "text")])["id"])
    job = run_with_a_late_tick(store, batch["id"], lambda: store.cancel("alice", batch["id"]))
    done = store.batch("alice", batch["id"])
    assert job.stop == "cancelled" and done["status"] == "cancelled"
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert [r["custom_id"] for r in read_results(store, done["output_file_id"])] == ["only"]


def test_a_runner_whose_job_was_taken_over_writes_nothing(store, tmp_path):
    batch = new_batch(store, add_input(store, tmp_path, [request_line("only", "text")])["id"])

    def taken_over():
        store.release(batch["id"], "r")  # as an expired lease: free for the next claim
        assert store.claim("successor", 60)[1]["id"] == batch["id"]

    job = run_with_a_late_tick(store, batch["id"], taken_over)
    assert job.stop == "lost" and done_lines(store.work_dir / batch["id"] / "output.jsonl") == set()
    assert store.batch("alice", batch["id"])["status"] == "in_progress"  # the successor's to finish
    assert store.renew(batch["id"], "r", 60) is None


def test_an_empty_or_missing_input_fails_the_job(store, tmp_path):
    blank = add_input(store, tmp_path, [b"", b"  "])
    batch = new_batch(store, blank["id"])
    _, job = run_job(store, "r", Answers())
    asyncio.run(job.run())
    failed = store.batch("alice", batch["id"])
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "empty_file"


def test_a_job_past_its_window_expires_keeping_what_is_done(store, tmp_path):
    batch = new_batch(store, add_input(store, tmp_path, [request_line("a")])["id"], window_s=-1)
    answers = Answers()
    _, job = run_job(store, "r", answers)
    asyncio.run(job.run())
    expired = store.batch("alice", batch["id"])
    assert expired["status"] == "expired" and expired["expired_at"] and not answers.calls
    assert expired["output_file_id"] is None and expired["request_counts"]["completed"] == 0


def test_two_runners_share_the_jobs_never_one_job(store, tmp_path):
    first = new_batch(store, add_input(store, tmp_path, [request_line(f"a{i}", f"a{i}") for i in range(5)],
                                       name="a.jsonl")["id"])
    second = new_batch(store, add_input(store, tmp_path, [request_line(f"b{i}", f"b{i}") for i in range(5)],
                                        name="b.jsonl")["id"])

    async def both():
        answers = [Answers(), Answers()]
        runners = [BatchRunner(store, a, RunnerSettings(lease_s=60, poll_s=0.01)) for a in answers]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        while any(store.batch("alice", b["id"])["status"] != "completed" for b in (first, second)):
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return answers

    answers = asyncio.run(both())
    calls = answers[0].calls + answers[1].calls
    assert sorted(calls) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])  # each line once
    assert {frozenset(c[0] for c in a.calls) for a in answers} <= {frozenset("a"), frozenset("b"), frozenset()}


def test_an_idle_runner_starts_a_job_created_in_its_process_at_once(store, tmp_path):
    file_id = add_input(store, tmp_path, [request_line("a", "a")])["id"]
    looked = asyncio.Event()
    claim = store.claim

    def claim_and_tell(*args):
        found = claim(*args)
        looked.set()
        return found

    store.claim = claim_and_tell

    async def scenario():
        answers = Answers()
        runner = BatchRunner(store, answers, RunnerSettings(lease_s=60, poll_s=3600))  # no second look of its own
        task = asyncio.create_task(runner.run())
        await looked.wait()  # it found no job: it waits
        batch = new_batch(store, file_id)
        async with asyncio.timeout(60):  # a guard: without the wake the runner waits poll_s
            await answers.entered.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return batch, answers

    batch, answers = asyncio.run(scenario())
    assert answers.calls == ["a"] and store.batch("alice", batch["id"])["status"] in ("in_progress", "completed")


def test_a_job_whose_input_vanishes_mid_run_fails_and_the_runner_goes_on(store, tmp_path):
    batch = new_batch(store, add_input(store, tmp_path, [request_line(f"id-{i}", f"t{i}") for i in range(4)])["id"])
    answers = Answers()
    _, job = run_job(store, "r", answers)

    async def scenario():
        answers.gate = asyncio.Event()
        task = asyncio.create_task(job.run())
        await answers.entered.wait()
        store.delete_file("alice", batch["input_file_id"])  # read again when the job is resumed: gone
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        _, again = run_job(store, "r2", Answers())
        await again.run()

    asyncio.run(scenario())
    failed = store.batch("alice", batch["id"])
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "job_error"
    assert "FileNotFoundError" in failed["errors"]["data"][0]["message"]

"""Operating the gateway, against the session's real tritonserver: TEI's timing headers and the
JSON access log on every answer; per-key limits from a keys file (requests and tokens per
minute exact under 32 concurrent clients on 2 worker processes, concurrent requests, models,
OpenAI's x-ratelimit-* headers, per-key metrics, the file re-read when it changes). The limits'
minute is the test's own clock (a file the gateway reads: ROSE_TEST_LIMITS_CLOCK), so which
window a request falls in never depends on the machine's speed."""
import concurrent.futures
import hashlib
import http.client
import json
import os
import re
import secrets
import time

import pytest

from gateway.http.limits import TEST_CLOCK_ENV, WINDOW_S
from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until

MODEL = "all-MiniLM-L6-v2"
KEYS = {name: secrets.token_hex(16) for name in ("open", "rpm", "tpm", "conc", "models", "later")}
MINUTE = 6000  # the test clock's window (its minutes since the epoch)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def write_atomically(path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Ops:
    def __init__(self, process: GatewayProcess, folder, tokens_per_request: int):
        self.process, self.folder, self.tokens_per_request = process, folder, tokens_per_request
        self.clock, self.keys_file, self.access_log = folder / "clock", folder / "keys.json", folder / "access.log"

    def set_clock(self, seconds: float) -> None:
        write_atomically(self.clock, repr(seconds))

    def post(self, key: str | None, body: dict, headers: dict | None = None, path: str = "/v1/embeddings"):
        """On a connection of its own (the kernel picks the worker): (status, headers, JSON body)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.process.port, timeout=60)
        try:
            auth = {"Authorization": f"Bearer {key}"} if key else {}
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **auth,
                                                                **(headers or {})})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())
        finally:
            connection.close()

    def embed(self, key: str, headers: dict | None = None):
        return self.post(key, {"model": MODEL, "input": ["the quick brown fox"]}, headers)

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]

    def metrics(self) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", self.process.port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            return connection.getresponse().read().decode()
        finally:
            connection.close()


def keys_document(tokens_per_minute: int, extra: dict | None = None) -> str:
    keys = {"open": {"sha256": digest(KEYS["open"])},
            "rpm": {"sha256": digest(KEYS["rpm"]), "requests_per_minute": 10},
            "tpm": {"sha256": digest(KEYS["tpm"]), "tokens_per_minute": tokens_per_minute},
            "conc": {"sha256": digest(KEYS["conc"]), "concurrent_requests": 1},
            "models": {"sha256": digest(KEYS["models"]), "models": ["some-other-model"]},
            **(extra or {})}
    return json.dumps({"keys": keys})


@pytest.fixture(scope="module")
def ops(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ops")
    keys_file = folder / "keys.json"
    keys_file.write_text(keys_document(1))
    shared_key = secrets.token_hex(8)
    process = GatewayProcess(folder / "gateway.log", [server.grpc_url],
                             ["--workers", "2", "--max-receiving-per-client", "256", "--keys-file", str(keys_file), "--access-log",
                              str(folder / "access.log")],
                             env={TEST_CLOCK_ENV: str(folder / "clock"), "ROSE_GATEWAY_API_KEYS": shared_key})
    ops = Ops(process, folder, 0)
    ops.shared_key = shared_key
    ops.set_clock(MINUTE * WINDOW_S + 12.5)
    status, _, body = ops.embed(KEYS["open"])
    assert status == 200, body
    ops.tokens_per_request = body["usage"]["prompt_tokens"]
    yield ops
    process.stop()


TIMING = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def test_timing_headers_and_the_access_log_line(ops, server):
    parent = "00-" + secrets.token_hex(16) + "-" + secrets.token_hex(8) + "-01"
    text = "a private sentence " + secrets.token_hex(8)
    with server.hold:  # the chunk waits in the encoder until the test lets it go
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(ops.post, KEYS["open"], {"model": MODEL, "input": [text, text]},
                                 {"traceparent": parent})
            wait_until(lambda: re.search(r"^gateway_replica_inflight\{[^}]*\} [1-9]", ops.metrics(), re.M), 60,
                       "the request's chunk to reach the encoder", 0.02)
            in_flight = time.perf_counter()  # its chunk was sent before this
            server.hold.release()
            released = time.perf_counter()
            status, headers, body = answer.result(60)
    assert status == 200, body
    times = {name: int(headers[name]) for name in TIMING}
    held_ms = int((released - in_flight) * 1000)
    assert times["x-inference-time"] >= held_ms
    assert times["x-total-time"] >= times["x-tokenization-time"] + times["x-queue-time"] + times["x-inference-time"]
    assert int(headers["x-compute-tokens"]) == body["usage"]["prompt_tokens"]
    line = wait_until(lambda: [x for x in ops.log_lines() if x["trace_id"] == parent[3:35]], 30, "the log line")
    (line,) = line
    assert (line["key"], line["model"], line["inputs"], line["tokens"], line["status"], line["path"]) == (
        "open", MODEL, 2, body["usage"]["prompt_tokens"], 200, "/v1/embeddings")
    assert line["inference_ms"] >= held_ms and line["total_ms"] >= line["inference_ms"]
    assert all(isinstance(line[f"{stage}_ms"], float) for stage in ("tokenization", "queue"))
    assert text not in ops.access_log.read_text()


def test_an_error_answer_has_the_headers_and_a_line_too(ops):
    parent = "00-" + secrets.token_hex(16) + "-" + secrets.token_hex(8) + "-01"
    status, headers, body = ops.post(ops.shared_key, {"model": MODEL, "input": []}, {"traceparent": parent})
    assert status == 400 and body["error"]["param"] == "input"
    assert headers["x-compute-tokens"] == "0" and headers["x-inference-time"] == "0"
    assert int(headers["x-total-time"]) >= 0
    (line,) = wait_until(lambda: [x for x in ops.log_lines() if x["trace_id"] == parent[3:35]], 30, "the log line")
    assert (line["status"], line["key"], line["tokens"], line["inputs"]) == (400, "shared", 0, 0)


def run_concurrently(ops, key: str, clients: int = 32):
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda _: ops.embed(key), range(clients)))


def test_requests_per_minute_are_exact_across_two_workers(ops):
    ops.set_clock(MINUTE * WINDOW_S + 12.5)  # 47.5 s left in this minute
    answers = run_concurrently(ops, KEYS["rpm"])
    accepted = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert len(accepted) == 10 and len(refused) == 22, sorted(a[0] for a in answers)
    for _, headers, body in refused:
        assert body["error"]["code"] == "rate_limit_exceeded" and "10 requests per minute" in body["error"]["message"]
        assert headers["retry-after"] == "48"
        assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"],
                headers["x-ratelimit-reset-requests"]) == ("10", "0", "47.5s")
    remaining = sorted(int(h["x-ratelimit-remaining-requests"]) for _, h, _ in accepted)
    assert remaining == list(range(10))  # each accepted request saw its own count
    assert all(h["x-ratelimit-limit-requests"] == "10" for _, h, _ in accepted)
    ops.set_clock((MINUTE + 1) * WINDOW_S + 59.98)  # the next minute: counted afresh
    status, headers, _ = ops.embed(KEYS["rpm"])
    assert status == 200 and headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-reset-requests"] == "20ms"
    metrics = ops.metrics()
    assert 'gateway_key_requests_total{key="rpm",status="200"} 11.0' in metrics
    assert 'gateway_key_refusals_total{key="rpm",limit="requests_per_minute"} 22.0' in metrics
    assert KEYS["rpm"] not in metrics


def test_tokens_per_minute_are_exact_across_two_workers(ops):
    per_request = ops.tokens_per_request
    limit = 7 * per_request + per_request // 2
    write_atomically(ops.keys_file, keys_document(limit))  # re-read on the next request
    ops.set_clock((MINUTE + 5) * WINDOW_S)
    answers = run_concurrently(ops, KEYS["tpm"])
    accepted = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert len(accepted) == 7 and len(refused) == 25, sorted(a[0] for a in answers)
    assert sum(body["usage"]["prompt_tokens"] for _, _, body in accepted) == 7 * per_request
    for _, headers, body in refused:
        assert "tokens per minute" in body["error"]["message"]
        assert headers["retry-after"] == "60" and headers["x-ratelimit-reset-tokens"] == "1m0s"
        assert (headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]) == (
            str(limit), str(limit - 7 * per_request))
        assert "x-ratelimit-limit-requests" not in headers  # no requests limit on this key
    assert sorted(int(h["x-ratelimit-remaining-tokens"]) for _, h, _ in accepted) == [
        limit - n * per_request for n in range(7, 0, -1)]
    metrics = ops.metrics()
    assert f'gateway_key_tokens_total{{key="tpm"}} {7.0 * per_request}' in metrics
    assert 'gateway_key_refusals_total{key="tpm",limit="tokens_per_minute"} 25.0' in metrics


def test_concurrent_requests_per_key(ops, server):
    with server.hold:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(ops.embed, KEYS["conc"])
            wait_until(lambda: 'gateway_active_requests 1.0' in ops.metrics(), 60, "the first request in flight", 0.05)
            status, headers, body = ops.embed(KEYS["conc"])
            assert status == 429 and headers["retry-after"] == "1", body
            assert "1 concurrent requests" in body["error"]["message"]
            server.hold.release()
            assert first.result(60)[0] == 200
    assert ops.embed(KEYS["conc"])[0] == 200  # its slot was given back


def test_a_model_the_key_may_not_use_is_403_naming_it(ops):
    status, _, body = ops.embed(KEYS["models"])
    assert status == 403 and body["error"]["param"] == "model"
    assert MODEL in body["error"]["message"] and "some-other-model" in body["error"]["message"]
    assert 'gateway_key_refusals_total{key="models",limit="models"} 1.0' in ops.metrics()


def test_keys_are_re_read_and_unknown_keys_refused(ops):
    assert ops.embed(KEYS["later"])[0] == 401
    assert ops.embed("not-a-key")[0] == 401
    write_atomically(ops.keys_file, keys_document(10 ** 6, {"later": {"sha256": digest(KEYS["later"])}}))
    assert ops.embed(KEYS["later"])[0] == 200
    write_atomically(ops.keys_file, "{not json")  # a broken edit: the keys each worker read before stay
    assert ops.embed(KEYS["open"])[0] == 200  # in every version (a worker may not have read the last good one)
    assert ops.embed(ops.shared_key)[0] == 200  # the single-key setting works beside the file

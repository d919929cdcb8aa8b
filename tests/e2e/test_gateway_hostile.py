"""Hostile clients against a real gateway process on the session's tritonserver, over
real sockets: numbers at and past the 64-bit edges, floats and strings where integers
belong, deep JSON nesting, lone surrogates, NUL bytes, huge fields, garbage bodies and
broken HTTP each get a 4xx, while good requests sent at the same time keep their rows
(equal to the same texts sent alone); stalled connections are cut off (408); stalled
uploads hold no request slot; past the concurrency bound 429, past the receiving bounds
429 / 503 with the connection closed; then the gateway serves as before."""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import random
import re
import signal
import socket
import urllib.request
from dataclasses import dataclass

import numpy as np
import pytest

from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until

MODEL = "all-MiniLM-L6-v2"
KEY = "hostile-sweep-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
EMBED, RERANK = "/v1/embeddings", "/v1/rerank"
GOOD_TEXTS = [f"good request {i}: " + "the quick brown fox " * (i % 5) for i in range(24)]
I64_MIN, I64_MAX, U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, "input": "x", **fields}).encode()


def rerank_body(**fields) -> bytes:
    return json.dumps({"query": "q", "documents": ["d"], **fields}).encode()


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    data: bytes
    path: str = EMBED
    method: str = "POST"
    headers: tuple = ()
    raw: bool = False  # data is the whole HTTP request, sent as is


def _raw_head(*lines: bytes) -> bytes:
    return b"\r\n".join(lines) + b"\r\n\r\n"


CASES = [
    # numbers at and past the 64-bit edges
    Case("dimensions -1", 400, body(dimensions=-1)),
    Case("dimensions int64 min", 400, body(dimensions=I64_MIN)),
    Case("dimensions below int64 (a float)", 400, body(dimensions=I64_MIN - 1)),
    Case("dimensions int64 max (above the width)", 400, body(dimensions=I64_MAX)),
    Case("dimensions 2**64 (a float)", 400, body(dimensions=1 << 64)),
    Case("dimensions 1e400", 400, body().replace(b'"x"', b'"x", "dimensions": 1e400')),
    Case("dimensions 400 digits", 400, body().replace(b'"x"', b'"x", "dimensions": 1' + b"0" * 400)),
    Case("dimensions NaN", 400, body().replace(b'"x"', b'"x", "dimensions": NaN')),
    Case("dimensions -Infinity", 400, body().replace(b'"x"', b'"x", "dimensions": -Infinity')),
    Case("token id int64 max", 400, body(input=[[101, I64_MAX]])),
    Case("token id 2**63", 400, body(input=[[1 << 63]])),
    Case("token id uint64 max", 400, body(input=[[U64_MAX]])),
    Case("token id 2**64 (a float)", 400, body(input=[[1 << 64]])),
    Case("token id int64 min", 400, body(input=[[I64_MIN]])),
    Case("token id -1", 400, body(input=[[101, -1]])),
    Case("flat token ids past int64", 400, body(input=[1 << 63, 1])),
    Case("top_n int64 max (no reranker served)", 404, rerank_body(top_n=I64_MAX), RERANK),
    Case("top_n uint64 max (past int64: refused before the model lookup)", 400, rerank_body(top_n=U64_MAX), RERANK),
    Case("top_n -1", 400, rerank_body(top_n=-1), RERANK),
    Case("top_n 2**64 (a float)", 400, rerank_body(top_n=1 << 64), RERANK),
    # floats and strings where integers belong
    Case("dimensions 1.5", 400, body(dimensions=1.5)),
    Case("dimensions 1e3", 400, body().replace(b'"x"', b'"x", "dimensions": 1e3')),
    Case("dimensions 'abc'", 400, body(dimensions="abc")),
    Case("dimensions '-1'", 400, body(dimensions="-1")),
    Case("dimensions ' 3'", 400, body(dimensions=" 3")),
    Case("dimensions '３' (fullwidth digit)", 400, body(dimensions="３")),
    Case("dimensions true", 400, body(dimensions=True)),
    Case("dimensions []", 400, body(dimensions=[])),
    Case("dimensions {}", 400, body(dimensions={})),
    Case("token id 1.0", 400, body(input=[[101, 1.0]])),
    Case("token id '7'", 400, body(input=[[101, "7"]])),
    Case("token id true", 400, body(input=[[True]])),
    Case("top_n 1.5", 400, rerank_body(top_n=1.5), RERANK),
    Case("top_n '3'", 400, rerank_body(top_n="3"), RERANK),
    Case("truncate 2", 400, body(truncate=2)),
    Case("input_type 7", 400, body(input_type=7)),
    Case("encoding_format 0", 400, body(encoding_format=0)),
    Case("encoding_format false", 400, body(encoding_format=False)),
    Case("encoding_format ''", 400, body(encoding_format="")),
    Case("model 5", 400, body(model=5)),
    Case("documents of numbers", 400, rerank_body(documents=[1, 2]), RERANK),
    # deep JSON nesting
    Case("100k open brackets", 400, b"[" * 100_000),
    Case("nested arrays past the parser's depth", 400, b"[" * 5000 + b"]" * 5000),
    Case("nested objects past the parser's depth", 400, b'{"a":' * 5000 + b"1" + b"}" * 5000),
    Case("input nested 1000 deep", 400, body().replace(b'"x"', b"[" * 1000 + b"]" * 1000)),
    Case("input [[[1]]]", 400, body(input=[[[1]]])),
    # lone surrogates, invalid UTF-8, NUL bytes
    Case("lone high surrogate in input", 400, body().replace(b'"x"', b'"\\ud800"')),
    Case("lone low surrogate in a key", 400, body().replace(b'"model"', b'"\\udfff", "model"')),
    Case("raw surrogate bytes in input", 400, body().replace(b'"x"', b'"\xed\xa0\x80"')),
    Case("invalid UTF-8 in input", 400, body().replace(b'"x"', b'"\xff\xfe"')),
    Case("raw NUL inside a string", 400, body().replace(b'"x"', b'"a\x00b"')),
    Case("NUL in the model name", 404, body(model=MODEL + "\x00")),
    Case("NUL in a field name", 400, body().replace(b'"input"', b'"in\\u0000put"')),
    Case("whitespace-only input", 400, body(input=" \u3000\t\n")),
    Case("empty input", 400, body(input="")),
    # huge fields
    Case("9 MiB body declared", 413, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x",
                                               b"Authorization: Bearer " + KEY.encode(),
                                               b"Content-Length: %d" % (9 << 20)) + body(model="m" * 100), raw=True),
    Case("5000 inputs", 413, body(input=["x"] * 5000)),
    Case("a 1.5 MiB text", 413, body(input="word " * 300_000)),
    Case("5 MiB of texts", 413, body(input=["word " * 200_000] * 5)),
    Case("a 100 KiB field name", 400, body().replace(b'"input"', b'"' + b"k" * 100_000 + b'": 1, "input"')),
    Case("300 token ids, truncate false", 400, body(input=[[101] * 300], truncate=False)),
    Case("a 5000-document rerank", 413, rerank_body(documents=["d"] * 5000), RERANK),
    # garbage bodies
    Case("empty body", 400, b""),
    Case("null", 400, b"null"),
    Case("a list", 400, b"[]"),
    Case("a number", 400, b"12345678901234567890"),
    Case("binary", 400, bytes(range(256))),
    Case("random bytes", 400, random.Random(17).randbytes(10_000)),
    Case("two objects", 400, body() + body()),
    Case("byte order mark", 400, b"\xef\xbb\xbf" + body()),
    Case("truncated object", 400, body()[:-5]),
    Case("form data", 400, b"model=all-MiniLM-L6-v2&input=x"),
    # methods, paths, keys
    Case("GET on embeddings", 405, b"", method="GET"),
    Case("PUT on embeddings", 405, body(), method="PUT"),
    Case("POST on models", 405, b"", "/v1/models"),
    Case("unknown path", 404, body(), "/v1/embeddings/../../etc/passwd"),
    Case("no key", 401, body(), headers=(("Authorization", ""),)),
    Case("wrong key", 401, body(), headers=(("Authorization", "Bearer nope"),)),
    Case("Basic auth", 401, body(), headers=(("Authorization", f"Basic {KEY}"),)),
    Case("non-ASCII key", 401, body(), headers=(("Authorization", "Bearer ключ".encode()),)),
    Case("latin-1 key", 401, body(), headers=(("Authorization", b"Bearer \xe9\xff" + KEY.encode()),)),
    Case("a 10 KiB key", 401, body(), headers=(("Authorization", "Bearer " + "k" * 10_000),)),
    # broken HTTP (sent raw; uvicorn answers plain text)
    Case("not HTTP", 400, b"GARBAGE\r\n\r\n", raw=True),
    Case("Content-Length abc", 400, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x", b"Content-Length: abc"), raw=True),
    Case("Content-Length -1", 400, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x", b"Content-Length: -1"), raw=True),
    Case("Content-Length past uint64", 400, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x",
                                                      b"Content-Length: 99999999999999999999999"), raw=True),
    Case("Content-Length 2**63 (over the body limit)", 413,
         _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x", b"Authorization: Bearer " + KEY.encode(),
                   b"Content-Length: %d" % (1 << 63)), raw=True),
    Case("two Content-Lengths", 400, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x", b"Content-Length: 1",
                                               b"Content-Length: 2") + b"{}", raw=True),
    Case("bad chunk size", 400, _raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x",
                                          b"Transfer-Encoding: chunked") + b"zz\r\n{}\r\n0\r\n\r\n", raw=True),
    Case("NUL in a header", 400, _raw_head(b"GET /health HTTP/1.1", b"Host: x", b"X-A: a\x00b"), raw=True),
    Case("64 KiB header", 431, _raw_head(b"GET /health HTTP/1.1", b"Host: x", b"X-A: " + b"a" * (64 << 10)), raw=True),
    Case("5000 headers", 431, _raw_head(b"GET /health HTTP/1.1", b"Host: x", *[b"X-%d: 1" % i for i in range(5000)]),
         raw=True),
]


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    """Its own gateway on the session's Triton: API keys, and short header and body deadlines."""
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "keys").write_text(KEY + "\n")
    process = GatewayProcess(folder / "gateway.log", [server.grpc_url],
                             ["--api-key-file", str(folder / "keys"), "--header-timeout", "3", "--body-timeout", "3"])
    yield process
    process.stop()


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (60 s at most between bytes)."""
    sock.settimeout(60)
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


def send(url: str, case: Case) -> tuple[int, bytes]:
    if case.raw:
        with socket.create_connection(host_port(url), timeout=60) as sock:
            try:
                sock.sendall(case.data)
            except (BrokenPipeError, ConnectionResetError):  # cut off while sending: the answer is in
                pass
            reply = read_all(sock)
        return int(reply.split(b" ", 2)[1]), reply.partition(b"\r\n\r\n")[2]
    connection = http.client.HTTPConnection(*host_port(url), timeout=60)
    try:
        headers = {**AUTH, **dict(case.headers)}
        connection.putrequest(case.method, case.path, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(case.data)))
        connection.endheaders()
        try:
            connection.send(case.data)
        except (BrokenPipeError, ConnectionResetError):  # refused before the body was read
            pass
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def embed(url: str, texts: list[str]) -> np.ndarray:
    request = urllib.request.Request(f"{url}{EMBED}", json.dumps({"model": MODEL, "input": texts,
                                                                  "encoding_format": "float"}).encode(), AUTH)
    with urllib.request.urlopen(request, timeout=120) as response:
        return np.array([d["embedding"] for d in json.load(response)["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def alone(gateway) -> dict[str, np.ndarray]:
    return {text: embed(gateway.url, [text])[0] for text in GOOD_TEXTS}


def good_batches(seed: int, num_batches: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [rng.sample(GOOD_TEXTS, rng.randint(1, len(GOOD_TEXTS))) for _ in range(num_batches)]


def assert_rows(batches, futures, alone):
    for texts, future in zip(batches, futures):
        rows = future.result()
        np.testing.assert_allclose(rows, [alone[t] for t in texts], atol=1e-4)


def test_every_hostile_request_gets_a_4xx_and_good_ones_keep_their_rows(gateway, alone):
    batches = good_batches(1, 40)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        good = [pool.submit(embed, gateway.url, texts) for texts in batches]
        hostile = [pool.submit(send, gateway.url, case) for case in CASES]
        outcomes = [(case, future.result()) for case, future in zip(CASES, hostile)]
    wrong = [f"{case.name}: got {status}, expected {case.status}: {reply[:200]!r}"
             for case, (status, reply) in outcomes if status != case.status]
    assert not wrong, "\n".join(wrong)
    for case, (status, reply) in outcomes:
        if not case.raw or status in (413, 431):  # the app's and the protocol's answers: OpenAI's error JSON
            error = json.loads(reply)["error"]
            assert error["message"] and error["type"], case.name
            assert "Traceback" not in error["message"] and "127.0.0.1" not in error["message"], case.name
    assert_rows(batches, good, alone)
    assert gateway.health() == 200 and gateway.process.poll() is None


def _stall(url: str, kind: str, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(host_port(url), timeout=60, source_address=(source, 0))
    if kind == "headers":
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Ty")
    elif kind == "body":
        sock.sendall(_raw_head(b"POST /v1/embeddings HTTP/1.1", b"Host: x", b"Authorization: Bearer " + KEY.encode(),
                               b"Content-Type: application/json", b"Content-Length: 1000") + b'{"model": "all-Mi')
    return sock  # "silent": connected, sends nothing


def test_stalled_connections_are_cut_off_and_good_requests_go_on(gateway, alone):
    """90 connections that stop sending (nothing, half the headers, part of the body):
    each gets a 408 and is closed; good requests sent meanwhile keep their rows."""
    stalled = [_stall(gateway.url, kind) for kind in ("silent", "headers", "body") for _ in range(30)]
    try:
        batches = good_batches(2, 12)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            good = [pool.submit(embed, gateway.url, texts) for texts in batches]
            replies = list(pool.map(read_all, stalled))
        assert_rows(batches, good, alone)
    finally:
        for sock in stalled:
            sock.close()
    for reply in replies:
        head, _, payload = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert len(embed(gateway.url, GOOD_TEXTS[:3])) == 3


def metrics_text(url: str, source: str = "127.0.0.1") -> str:
    connection = http.client.HTTPConnection(*host_port(url), timeout=10, source_address=(source, 0))
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def metric(url: str, name: str, source: str = "127.0.0.1") -> float:
    for line in metrics_text(url, source).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_stalled_uploads_hold_no_slot_and_held_requests_fill_the_slots(server, alone, tmp_path):
    """Twelve uploads that stall, against --max-concurrent-requests 4: they hold connections,
    not slots, and good requests sent meanwhile get their rows. Four requests held in the
    encoder do fill the slots: the next one gets 429, and is served once they are answered."""
    (tmp_path / "keys").write_text(KEY)
    bounded = GatewayProcess(tmp_path / "gateway.log", [server.grpc_url],
                             ["--api-key-file", str(tmp_path / "keys"), "--max-concurrent-requests", "4",
                              "--body-timeout", "600"])
    stalled = []
    try:
        stalled = [_stall(bounded.url, "body") for _ in range(12)]
        wait_until(lambda: metric(bounded.url, "gateway_receiving_connections") == 12, 60,
                   "the stalled uploads to be receiving", 0.05)
        batches = good_batches(3, 8)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            good = [pool.submit(embed, bounded.url, texts) for texts in batches]
            assert_rows(batches, good, alone)
        assert metric(bounded.url, "gateway_receiving_connections") == 12
        assert metric(bounded.url, "gateway_active_requests") == 0
        with server.hold, concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = [pool.submit(embed, bounded.url, [text]) for text in GOOD_TEXTS[:4]]
            wait_until(lambda: metric(bounded.url, "gateway_active_requests") == 4, 60,
                       "the held requests to take the slots", 0.05)
            status, reply = send(bounded.url, Case("good", 200, body(input=["hello"])))
            assert status == 429 and json.loads(reply)["error"]["code"] == "rate_limit_exceeded"
            assert bounded.health() == 200  # /health is not bounded
            server.hold.release()
            assert_rows([[text] for text in GOOD_TEXTS[:4]], held, alone)
        assert len(embed(bounded.url, ["hello"])) == 1
    finally:
        for sock in stalled:
            sock.close()
        bounded.stop()


def refused_total(url: str, reason: str) -> float:
    found = re.search(rf'^gateway_refused_connections_total{{reason="{reason}"}} (\S+)$', metrics_text(url), re.M)
    return float(found.group(1)) if found else 0.0


def get_from(url: str, path: str, source: str) -> tuple[int, bytes]:
    """GET `path` from `source`: (status, the whole answer), on a connection the gateway closes."""
    with socket.create_connection(host_port(url), timeout=60, source_address=(source, 0)) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n"
                     % (path.encode(), KEY.encode()))
        reply = read_all(sock)
    return int(reply.split(b" ", 2)[1]), reply


def assert_clean_refusal(reply: bytes, status: int, code: str) -> None:
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), reply[:200]
    assert b"connection: close" in head.lower() and b"retry-after: 1" in head.lower()
    assert json.loads(payload)["error"]["code"] == code


def test_past_the_receiving_bounds_a_clean_refusal_and_idle_connections_do_not_count(server, alone, tmp_path):
    """--max-receiving-per-client 3, --max-receiving-connections 5, and eight kept-alive
    connections idle from 127.0.0.1 (they do not count): three stalled uploads from 127.0.0.1
    fill its share (a fourth gets 429), two from 127.0.0.2 fill the whole (a request from
    127.0.0.3 gets 503, a health probe still 200); each refusal is OpenAI's error JSON, Retry-After and the connection
    closed. Once the uploads leave, the idle connections get their rows."""
    (tmp_path / "keys").write_text(KEY)
    bounded = GatewayProcess(tmp_path / "gateway.log", [server.grpc_url],
                             ["--api-key-file", str(tmp_path / "keys"), "--max-receiving-per-client", "3",
                              "--max-receiving-connections", "5", "--body-timeout", "600", "--header-timeout", "600",
                              "--keep-alive-timeout", "600"])
    idle = [http.client.HTTPConnection(*host_port(bounded.url), timeout=60) for _ in range(8)]
    stalled = []
    try:
        for connection in idle:
            connection.request("GET", "/health")
            assert connection.getresponse().read() and connection.sock is not None
        stalled = [_stall(bounded.url, "body") for _ in range(3)]
        wait_until(lambda: metric(bounded.url, "gateway_receiving_connections", "127.0.0.9") == 3,
                   60, "the stalled uploads to be receiving", 0.05)
        with _stall(bounded.url, "body") as refused:
            assert_clean_refusal(read_all(refused), 429, "rate_limit_exceeded")
        stalled += [_stall(bounded.url, "body", "127.0.0.2") for _ in range(2)]
        _, reply = wait_until(lambda: (answer := get_from(bounded.url, "/v1/models", "127.0.0.3"))[0] == 503
                              and answer, 60, "the receiving bound to be full", 0.05)
        assert_clean_refusal(reply, 503, "server_busy")
        assert b"at most 5" in reply
        assert get_from(bounded.url, "/health", "127.0.0.3")[0] == 200  # on a place kept for probes
        for sock in stalled:
            sock.close()
        wait_until(lambda: metric(bounded.url, "gateway_receiving_connections", "127.0.0.9") == 0, 60,
                   "the uploads that left to stop counting", 0.05)
        assert refused_total(bounded.url, "client") == 1 and refused_total(bounded.url, "receiving") >= 1
        for i, connection in enumerate(idle):
            texts = GOOD_TEXTS[i:i + 3]
            connection.request("POST", EMBED, json.dumps({"model": MODEL, "input": texts}), AUTH)
            response = connection.getresponse()
            assert response.status == 200
            rows = [d["embedding"] for d in json.loads(response.read())["data"]]
            np.testing.assert_allclose(rows, [alone[t] for t in texts], atol=1e-4)
    finally:
        for sock in stalled:
            sock.close()
        for connection in idle:
            connection.close()
        bounded.stop()


@pytest.mark.parametrize("dimensions", [
    pytest.param(1 << 63, id="2**63"),
    pytest.param("9" * 30, id="'9'*30"),
])
def test_dimensions_past_int64_is_400_and_the_gateway_serves_on(server, tmp_path, dimensions):
    """Issue 17's report: such a request hung, and each one wedged one dispatcher slot for good."""
    (tmp_path / "keys").write_text(KEY)
    own = GatewayProcess(tmp_path / "gateway.log", [server.grpc_url], ["--api-key-file", str(tmp_path / "keys")])
    try:
        for _ in range(5):  # more than the 4 slots of the replica
            connection = http.client.HTTPConnection(*host_port(own.url), timeout=20)
            try:
                connection.request("POST", EMBED, body(dimensions=dimensions), AUTH)
                assert connection.getresponse().status == 400
            finally:
                connection.close()
        assert len(embed(own.url, ["still served"])) == 1
    finally:
        own.stop()


def test_sigterm_drains_requests_in_flight_and_refuses_new_connections(server, alone, tmp_path):
    """A gateway told to stop (SIGTERM, as Kubernetes does after preStop) while a request waits in
    the held encoder: it stops accepting connections, answers the request in flight with its rows
    once the encoder is released, then exits."""
    (tmp_path / "keys").write_text(KEY)
    draining = GatewayProcess(tmp_path / "gateway.log", [server.grpc_url], ["--api-key-file", str(tmp_path / "keys")])
    try:
        with server.hold, concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(embed, draining.url, GOOD_TEXTS[:3])
            wait_until(lambda: metric(draining.url, "gateway_active_requests") >= 1, 60,
                       "the request to reach the gateway", 0.05)
            draining.process.terminate()
            wait_until(lambda: draining.health() is None, 60,  # the listening socket closes first
                       "the gateway to stop accepting connections after SIGTERM", 0.05)
            assert not in_flight.done() and draining.process.poll() is None
            server.hold.release()
            rows = in_flight.result(timeout=120)
        np.testing.assert_allclose(rows, np.stack([alone[t] for t in GOOD_TEXTS[:3]]), atol=1e-5)
        # uvicorn re-raises the signal once its graceful shutdown is done: "killed" by SIGTERM after draining
        assert draining.process.wait(60) in (0, -signal.SIGTERM), draining.log_tail()
    finally:
        draining.stop()

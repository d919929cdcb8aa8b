"""The gateway's HTTP limits and security defaults, in process: the concurrency bound
(429; a request still sending its body holds no slot), the bytes of bodies held (503),
admission by tokens (413 past the whole bound, 429 past what is left), the body
deadline (408), the header deadline and size (uvicorn protocol: 408 / 431), API keys
as bytes, errors that show no replica or internal text, and the loopback-or-keys rule.
Over a real socket, with hostile clients: tests/e2e/test_gateway_hostile.py."""
import asyncio
import logging

import numpy as np
import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from engine_lib.config import PairTokenizerConfig
from engine_lib.options import RerankOptions
from engine_lib.tokenization.pairs import PairTokenizer
from gateway.api import openai
from gateway.config import GatewayConfig, parse_args
from gateway.engine import routing
from gateway.http.protocol import limited_protocol
from rose_client.aio_stream import ReplicaError
from testing.gateway_app import gateway_client

MODEL = "all-MiniLM-L6-v2"


class GatedReplica:
    """Embeds a sequence as [sum of its ids, its length]; holds every call until `open()`
    (None: answers at once). `error`: every call fails with it."""

    def __init__(self, gated=False, error=None):
        self.gate = asyncio.Event() if gated else None
        self.error = error
        self.calls = []
        self.waiting = asyncio.Queue()

    def slot(self, url):
        replica = self

        class Slot:
            async def call(self, call):
                replica.calls.append(call)
                await replica.waiting.put(call)
                if replica.gate is not None:
                    await replica.gate.wait()
                if replica.error:
                    raise ReplicaError(url, replica.error)
                if call.model == "rerank":
                    return np.array([len(d) for d in call.inputs["DOCUMENTS"]], dtype=np.float32)
                ids, lens = call.inputs["INPUT_IDS"], call.inputs["SEQ_LENS"]
                sums = [part.sum() for part in np.split(ids, np.cumsum(lens)[:-1])]
                return np.stack([sums, lens], axis=1).astype(np.float32)

            async def is_ready(self):
                return True

            async def close(self):
                pass

        return Slot()



def run(scenario, replica_factory=GatedReplica, reranker=False, **config):
    """`await scenario(client, app, replica)` against the app; the replicas are in process."""
    async def main():
        replica = replica_factory()
        async with gateway_client(replica.slot, workers=4, reranker=reranker, **config) as (client, app):
            return await asyncio.wait_for(scenario(client, app, replica), 60)  # a hang fails here

    return asyncio.run(main())


def embed(client, texts, **headers):
    return client.post("/v1/embeddings", json={"model": MODEL, "input": texts}, headers=headers)


def test_past_the_concurrency_bound_429_and_the_held_requests_keep_their_rows():
    async def scenario(client, app, replica):
        held = [asyncio.ensure_future(embed(client, [f"held {i}"])) for i in range(2)]
        for _ in held:
            await replica.waiting.get()  # both are at the replica
        refused = await embed(client, ["one too many"])
        health = await client.get("/health")
        metrics = (await client.get("/metrics")).text
        replica.gate.set()
        held = [await h for h in held]
        return refused, health, metrics, held, [await embed(client, [f"held {i}"]) for i in range(2)]

    refused, health, metrics, held, alone = run(scenario, lambda: GatedReplica(gated=True), max_concurrent_requests=2)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "at most 2" in error["message"]
    assert health.status_code == 200 and "gateway_active_requests 2.0" in metrics
    assert [r.status_code for r in held + alone] == [200] * 4  # the slots came back
    assert [r.json()["data"] for r in held] == [r.json()["data"] for r in alone]  # each its own text's row


def test_a_request_over_the_whole_token_bound_is_413_not_429():
    async def scenario(client, app, replica):
        return await embed(client, ["many words " * 20]), replica.calls

    response, calls = run(scenario, max_pending_tokens=10)
    assert response.status_code == 413 and "at most 10 at a time" in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "input" and not calls


def test_past_the_tokens_left_429_and_it_passes_once_they_are_answered():
    async def scenario(client, app, replica):
        held = asyncio.ensure_future(embed(client, ["eight tokens of held text here"]))
        await replica.waiting.get()
        pending = app.state.gateway.pending_tokens
        refused = await embed(client, ["also quite a few more tokens of text in this one"])
        replica.gate.set()
        return pending, refused, await held, await embed(client, ["also quite a few more tokens of text in this one"])

    pending, refused, held, later = run(scenario, lambda: GatedReplica(gated=True), max_pending_tokens=16)
    tokens = later.json()["usage"]["prompt_tokens"]
    assert 0 < pending <= 16 and tokens <= 16 < pending + tokens
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert held.status_code == 200 and later.status_code == 200


def test_reranking_is_admitted_by_tokens_not_documents():
    body = {"query": "q", "documents": ["a few words of document text"] * 3}

    async def scenario(client, app, replica):
        return await client.post("/v1/rerank", json=body), replica.calls

    limits = routing.read_limits(GatewayConfig.rerank_tokenizer_config)
    tokens = openai.admission_tokens(openai.parse_rerank_request(body, limits), routing.LONGEST_PAIR)
    response, calls = run(scenario, reranker=True, max_pending_tokens=tokens - 1)
    assert response.status_code == 413 and response.json()["error"]["param"] == "documents" and not calls
    response, calls = run(scenario, reranker=True, max_pending_tokens=tokens)
    assert response.status_code == 200 and len(calls) == 1


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta", "qwen3"])
def test_rerank_admission_is_an_upper_bound_on_the_tokens_run(kind, tmp_path):
    from testing.tiny_rerankers import save_reranker

    save_reranker(kind, tmp_path)
    limits = PairTokenizerConfig(model_dir=str(tmp_path))
    pairs = PairTokenizer(str(tmp_path), limits)
    query = "what is the capital of france"
    documents = ["paris", "the eiffel tower stands in paris " * 30, "ünïcödé 🚀 и 中文", "a , b . c"]
    for instruction in ("", "Judge by relevance") if kind == "qwen3" else ("",):
        parameters = {"instruction": instruction} if instruction else {}
        request = openai.RerankRequest(None, query, documents, None, True, parameters)
        tokens = pairs.encode(query, documents, RerankOptions.from_parameters(parameters))
        seq_lens = tokens.seq_lens
        bound = openai.admission_tokens(request, routing.max_pair_tokens(limits))
        assert routing.max_pair_tokens(limits) >= pairs.max_length
        assert bound >= int(seq_lens.sum()), (bound, seq_lens)


def test_a_stalled_body_is_408_and_closes_the_connection():
    async def scenario(client, app, replica):
        stalled = asyncio.Event()

        async def body():
            yield b'{"model": "' + MODEL.encode() + b'", "input": '
            await stalled.wait()  # never set: the client stops sending

        return await client.post("/v1/embeddings", content=body(), headers={"content-type": "application/json"})

    response = run(scenario, body_timeout_s=0.05)
    assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
    assert response.headers["connection"] == "close"


def stalled_upload(client, first: bytes, rest: bytes, go_on: asyncio.Event):
    """A POST /v1/embeddings whose body stops after `first` until `go_on` is set."""
    async def body():
        yield first
        await go_on.wait()
        yield rest

    return asyncio.ensure_future(client.post("/v1/embeddings", content=body(),
                                             headers={"content-type": "application/json"}))


def test_a_request_still_sending_its_body_holds_no_slot():
    async def scenario(client, app, replica):
        go_on = asyncio.Event()
        text = orjson.dumps({"model": MODEL, "input": ["stalled"]})
        stalled = stalled_upload(client, text[:20], text[20:], go_on)
        while app.state.gateway.bodies.held < 20:  # the upload is in, reading its body
            await asyncio.sleep(0)
        good = await embed(client, ["good"])
        active_meanwhile = app.state.gateway.active_requests
        go_on.set()
        return good, active_meanwhile, await stalled

    good, active_meanwhile, stalled = run(scenario, max_concurrent_requests=1)
    assert good.status_code == 200 and active_meanwhile == 0 and stalled.status_code == 200


def test_past_the_bytes_of_bodies_held_503_and_they_come_back():
    async def scenario(client, app, replica):
        go_on = asyncio.Event()
        text = orjson.dumps({"model": MODEL, "input": ["x" * 880]})
        stalled = stalled_upload(client, text[:-10], text[-10:], go_on)
        bodies = app.state.gateway.bodies
        while bodies.held < len(text) - 10:
            await asyncio.sleep(0)
        refused = await embed(client, ["y" * 600])
        go_on.set()
        done = await stalled
        return refused, done, bodies.held, await embed(client, ["y" * 600])

    refused, done, held_after, later = run(scenario, max_body_bytes=1000, max_buffered_body_bytes=1500)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.headers["connection"] == "close" and refused.json()["error"]["code"] == "server_busy"
    assert done.status_code == 200 and held_after == 0 and later.status_code == 200


def test_non_ascii_authorization_is_401_and_keys_compare_as_utf8_bytes():
    keys = frozenset({"s3cret-key", "ключ-0123456789"})

    async def scenario(client, app, replica):
        return [await embed(client, ["x"], authorization=value) for value in (
            "Bearer ключ".encode(), b"Bearer \xff\xfe", "Bearér s3cret-key".encode("latin-1"),
            "Bearer ключ-0123456789".encode(), b"Bearer s3cret-key")]

    responses = run(scenario, api_keys=keys)
    assert [r.status_code for r in responses] == [401, 401, 401, 200, 200]
    assert all(r.json()["error"]["code"] == "invalid_api_key" for r in responses[:3])


def test_failures_show_no_replica_address_or_internal_text(caplog, monkeypatch):
    secret = "connect to 10.9.8.7:8001 failed: Connection refused (errno 111)"
    caplog.set_level(logging.WARNING, logger="gateway")

    async def scenario(client, app, replica):
        failed = await embed(client, ["x"])
        monkeypatch.setattr(app.state.gateway.tokenizer, "encode_many", lambda *args: 1 / 0)
        broken = await embed(client, ["y"])
        return failed, broken

    failed, broken = run(scenario, lambda: GatedReplica(error=secret))
    assert failed.status_code == 503 and broken.status_code == 500
    for response in (failed, broken):
        text = response.text
        assert "10.9.8.7" not in text and "fake:1" not in text and "refused" not in text and "Division" not in text
    assert broken.json()["error"]["message"] == "internal error"
    assert secret in caplog.text and "ZeroDivisionError" in caplog.text  # the log keeps them


@pytest.mark.parametrize("host, open_", [("127.0.0.1", False), ("127.8.9.1", False), ("::1", False),
                                         ("localhost", False), ("0.0.0.0", True), ("::", True), ("", True),
                                         ("10.0.0.5", True), ("gateway.example", True)])
def test_an_open_address_needs_keys_or_allow_unauthenticated(host, open_, monkeypatch):
    monkeypatch.delenv("ROSE_GATEWAY_API_KEYS", raising=False)
    monkeypatch.delenv("ROSE_GATEWAY_ALLOW_UNAUTHENTICATED", raising=False)
    if open_:
        with pytest.raises(ValueError, match="--allow-unauthenticated"):
            parse_args(["--host", host])
    else:
        assert parse_args(["--host", host]).host == host
    assert parse_args(["--host", host, "--allow-unauthenticated"]).allow_unauthenticated
    monkeypatch.setenv("ROSE_GATEWAY_ALLOW_UNAUTHENTICATED", "1")
    assert parse_args(["--host", host]).allow_unauthenticated
    monkeypatch.delenv("ROSE_GATEWAY_ALLOW_UNAUTHENTICATED")
    monkeypatch.setenv("ROSE_GATEWAY_API_KEYS", "a-key")
    assert parse_args(["--host", host]).api_keys == {"a-key"}


class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written, self.closed = bytearray(), asyncio.Event()

    def write(self, data):
        self.written += data

    def close(self):
        self.closed.set()

    def is_closing(self):
        return self.closed.is_set()

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def protocol_run(chunks, **limits):
    """Feed `chunks` to the gateway's uvicorn protocol; -> (bytes written back, app calls).
    Returns when the connection is closed, or once the app has answered every request."""
    calls = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main():
        config = GatewayConfig(**limits)
        uvicorn_config = uvicorn.Config(app, http=limited_protocol(config), lifespan="off", log_level="critical")
        uvicorn_config.load()
        protocol = uvicorn_config.http_protocol_class(config=uvicorn_config, server_state=ServerState(), app_state={})
        transport = FakeTransport()
        protocol.connection_made(transport)
        for chunk in chunks:
            protocol.data_received(chunk)
        await asyncio.wait_for(transport.closed.wait(), 30)
        return bytes(transport.written)

    written = asyncio.run(main())
    return written, calls


def test_headers_that_stop_coming_are_408_and_the_connection_closes():
    written, calls = protocol_run([b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Le"], header_timeout_s=0.05)
    head, _, body = written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head and not calls
    assert orjson.loads(body)["error"]["code"] == "request_timeout"


def test_the_header_deadline_restarts_after_each_answer():
    """A kept-alive connection that answered a request and then sends half a request line."""
    written, calls = protocol_run([b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /hea"], header_timeout_s=0.05)
    assert calls == ["/health"]
    assert written.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in written


@pytest.mark.parametrize("request_head", [
    b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n",                       # the URL alone, unfinished
    b"GET / HTTP/1.1\r\n" + b"X-Filler: " + b"b" * 3000 + b"\r\n" * 2,  # one header, whole request
    b"GET / HTTP/1.1\r\n" + b"X-A: 1234567890\r\n" * 300,              # many headers, unfinished
])
def test_headers_over_the_size_bound_are_431(request_head):
    written, calls = protocol_run([request_head], max_header_bytes=2048)
    head, _, body = written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ") and not calls
    assert orjson.loads(body)["error"]["code"] == "request_too_large"


def test_headers_within_the_bounds_reach_the_app():
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: 1234567890\r\n" * 100 + b"Connection: close\r\n\r\n"
    written, calls = protocol_run([head], max_header_bytes=2048)
    assert calls == ["/health"] and written.startswith(b"HTTP/1.1 200 ")

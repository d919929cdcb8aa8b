"""The gateway `make serve` starts, against the session's real tritonserver,
through the official `openai` client and langchain-openai: rows equal the
ensemble's (same ids) and sentence-transformers'; every error status."""
import concurrent.futures
import http.client
import json
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.text import TextTokenizer
from rose_triton.server import free_port
from testing.embed_clients import embed_stream
from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "Ünïcödé and emoji 🚀 work too",
         "a longer passage " * 40]


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.gateway_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def ensemble_rows(server):
    return embed_stream(server.grpc_url, TEXTS)


def post(url, body, headers=None, timeout=60):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.load(exc)


def test_default_call_is_base64_and_matches_ensemble_and_reference(client, ensemble_rows, reference_model, model_dir):
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS)
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"  # the client's default
    response = raw.parse()
    rows = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert cosine(rows, ensemble_rows).min() >= 0.9999
    reference = reference_model.encode(TEXTS, normalize_embeddings=True)
    assert cosine(rows, reference).min() >= MIN_COSINE
    seq_lens = TextTokenizer(model_dir, TokenizerConfig()).encode(TEXTS, RequestOptions()).seq_lens
    assert response.usage.prompt_tokens == response.usage.total_tokens == int(seq_lens.sum())
    assert response.model == MODEL and [d.index for d in response.data] == [0, 1, 2, 3]


def test_float_and_dimensions_match_the_ensemble(client, server):
    response = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float", dimensions=64)
    rows = np.array([d.embedding for d in response.data])
    assert rows.shape == (2, 64)
    expected = embed_stream(server.grpc_url, TEXTS[:2], parameters={"dimensions": 64})
    assert cosine(rows, expected).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)
    batch = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float", dimensions=64,
                                     extra_body={"priority": "batch"})  # the encoder takes the class it is sent
    assert cosine(np.array([d.embedding for d in batch.data]), expected).min() >= 0.9999


def test_token_ids_and_query_type_match_the_text_path(client, server, model_dir, ensemble_rows):
    tokens = TextTokenizer(model_dir, TokenizerConfig()).encode(TEXTS[:2], RequestOptions())
    ids, lens = tokens.input_ids, tokens.seq_lens
    token_lists = [part.tolist() for part in np.split(ids, np.cumsum(lens)[:-1])]
    by_ids = client.embeddings.create(model=MODEL, input=token_lists)
    rows = np.array([d.embedding for d in by_ids.data])
    assert cosine(rows, ensemble_rows[:2]).min() >= 0.9999 and by_ids.usage.prompt_tokens == int(lens.sum())
    single = client.embeddings.create(model=MODEL, input=token_lists[0])
    assert cosine(single.data[0].embedding, ensemble_rows[0]) >= 0.9999
    query = client.embeddings.create(model=MODEL, input=TEXTS[:1], extra_body={"input_type": "query"})
    expected = embed_stream(server.grpc_url, TEXTS[:1], parameters={"input_type": "query"})
    assert cosine(query.data[0].embedding, expected[0]) >= 0.9999


def test_langchain_openai_embeddings(server, ensemble_rows):
    embedder = OpenAIEmbeddings(model=MODEL, base_url=f"{server.gateway_url}/v1", api_key="unused",
                                check_embedding_ctx_length=False)
    documents = np.array(embedder.embed_documents(TEXTS))
    query = np.array(embedder.embed_query(TEXTS[0]))
    assert cosine(documents, ensemble_rows).min() >= 0.9999
    assert cosine(query, ensemble_rows[0]) >= 0.9999


def test_openai_client_errors(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.BadRequestError, match=r"input\[1\] is empty"):
        client.embeddings.create(model=MODEL, input=["fine", "   "])
    with pytest.raises(openai.BadRequestError, match="'dimensions' is 999"):
        client.embeddings.create(model=MODEL, input="x", dimensions=999)
    with pytest.raises(openai.BadRequestError, match="'priority' must be one of"):
        client.embeddings.create(model=MODEL, input="x", extra_body={"priority": "urgent"})
    with pytest.raises(openai.BadRequestError, match="truncate=false"):
        client.embeddings.create(model=MODEL, input="word " * 400, extra_body={"truncate": False})
    with pytest.raises(openai.APIStatusError) as info:
        client.embeddings.create(model=MODEL, input=["x"] * 5000)
    assert info.value.status_code == 413


def test_bad_requests_never_disturb_concurrent_good_ones(server, ensemble_rows):
    url = f"{server.gateway_url}/v1/embeddings"
    bad = [{"model": MODEL, "input": ["ok", ""]}, {"model": MODEL, "input": [[1, -5]]}, b"{oops",
           {"model": MODEL, "input": "x", "dimensions": 10_000}]
    jobs = [(body, 400) for body in bad * 3] + [({"model": MODEL, "input": TEXTS}, 200)] * 6
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: (job[1], post(url, job[0])), jobs))
    for expected, (status, _, body) in results:
        assert status == expected, body
        if status == 200:
            rows = np.array([d["embedding"] for d in body["data"]])
            assert cosine(rows, ensemble_rows).min() >= 0.9999
        else:
            assert body["error"]["message"] and body["error"]["type"] == "invalid_request_error"


HOSTILE_DIMENSIONS = [b"9223372036854775808"] * 5 + [b"9223372036854775807", b"-1", b"1e30", b'"12"']


def test_numbers_past_the_limits_are_refused_naming_the_field_and_the_gateway_keeps_serving(server, ensemble_rows):
    """Issue 17: five requests with `dimensions` 2**63 used to wedge every later /v1/embeddings
    request (the number failed in gRPC's serialisation and killed a dispatcher worker each)."""
    url = f"{server.gateway_url}/v1/embeddings"
    for raw in HOSTILE_DIMENSIONS:
        body = b'{"model": "%s", "input": "x", "dimensions": %s}' % (MODEL.encode(), raw)
        status, _, answer = post(url, body, timeout=30)
        assert 400 <= status < 500 and answer["error"]["param"] == "dimensions", (raw, status, answer)
    status, _, answer = post(url, {"model": MODEL, "input": TEXTS}, timeout=30)
    assert status == 200, answer
    rows = np.array([d["embedding"] for d in answer["data"]])
    assert cosine(rows, ensemble_rows).min() >= 0.9999


def test_rerank_is_404_naming_the_model_without_a_reranker(server):
    status, _, body = post(f"{server.gateway_url}/v1/rerank", {"model": "rerank", "query": "q", "documents": ["d"]})
    assert status == 404 and "'rerank'" in body["error"]["message"] and "no reranker" in body["error"]["message"]


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(f"{server.gateway_url}/health") as r:
        assert json.load(r)["replicas_ready"] == 1
    client.embeddings.create(model=MODEL, input=TEXTS)
    with urllib.request.urlopen(f"{server.gateway_url}/metrics") as r:
        text = r.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples['gateway_requests_total{endpoint="embeddings",status="200"}']) >= 1
    assert float(samples["gateway_tokens_total"]) > 0
    assert float(samples[f'gateway_replica_ready{{replica="{server.grpc_url}"}}']) == 1
    assert f'gateway_replica_inflight{{replica="{server.grpc_url}"}}' in samples


def gateway_samples(gateway_url) -> dict[str, float]:
    with urllib.request.urlopen(f"{gateway_url}/metrics") as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def test_a_client_that_leaves_stops_its_queued_chunks(server, client):
    """Seconds of chunks for one replica, held in the encoder (testing/hold.py); the client
    hangs up once the first are in flight: the rest are never sent, the metrics say so, and
    the gateway keeps serving."""
    inflight = f'gateway_replica_inflight{{replica="{server.grpc_url}"}}'
    done = f'gateway_replica_chunks_completed{{replica="{server.grpc_url}"}}'
    planned = 'gateway_chunks_total{endpoint="embeddings"}'
    before = gateway_samples(server.gateway_url)
    texts = [f"left behind {i} " + "a longer passage " * 25 for i in range(3000)]
    host, port = server.gateway_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/v1/embeddings", json.dumps({"model": MODEL, "input": texts}),
                       {"Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    with server.hold:  # nothing is answered before the client leaves, on any machine
        wait_until(lambda: gateway_samples(server.gateway_url).get(inflight, 0) >= 1, 60,
                   "a chunk of the request to go out", 0.02)
        connection.close()
        disconnects = before.get("gateway_client_disconnects_total", 0) + 1
        wait_until(lambda: gateway_samples(server.gateway_url).get("gateway_client_disconnects_total", 0)
                   >= disconnects, 60, "the gateway to see the client leave", 0.02)
    while (now := gateway_samples(server.gateway_url)).get(inflight, 0) or now["gateway_pending_tokens"]:
        assert time.monotonic() < deadline, "the chunks in flight never finished"
        time.sleep(0.1)
    num_planned = now[planned] - before[planned]
    num_answered = now[done] - before.get(done, 0)
    assert num_planned > 40 and num_answered < num_planned / 2, (num_planned, num_answered)
    assert now["gateway_client_disconnects_total"] == before.get("gateway_client_disconnects_total", 0) + 1
    assert now['gateway_requests_total{endpoint="embeddings",status="499"}'] >= 1
    assert len(client.embeddings.create(model=MODEL, input=TEXTS).data) == len(TEXTS)


@pytest.fixture(scope="module")
def strict_gateway(server, tmp_path_factory):
    """A second gateway alone on the same Triton, found through DNS (dns:///localhost:port):
    API keys and a small pending-token bound."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# one key a line\nfirst-key-0123456789\nsecond-key-0123456789\n")
    port = server.grpc_url.rsplit(":", 1)[1]
    gateway = GatewayProcess(keys.parent / "gateway.log", [f"dns:///localhost:{port}"],
                             ["--api-key-file", str(keys), "--max-pending-tokens", "64"])
    yield gateway
    gateway.stop()


def test_api_keys_401_and_a_request_over_the_pending_bound_413(strict_gateway):
    url = f"{strict_gateway.url}/v1/embeddings"
    status, _, body = post(url, {"model": MODEL, "input": "x"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    keyed = openai.OpenAI(base_url=f"{strict_gateway.url}/v1", api_key="second-key-0123456789", max_retries=0)
    assert len(keyed.embeddings.create(model=MODEL, input="x").data) == 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{strict_gateway.url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.APIStatusError) as info:  # alone over the whole bound: no retry could pass
        keyed.embeddings.create(model=MODEL, input="many words " * 50)
    assert info.value.status_code == 413 and info.value.response.json()["error"]["code"] == "request_too_large"


def test_no_replica_is_503(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    gateway = GatewayProcess(tmp_path / "gateway.log", [dead], wait_ready=False)
    try:
        assert gateway.health() == 503
        status, headers, body = post(f"{gateway.url}/v1/embeddings", {"model": MODEL, "input": "x"})
        assert status == 503 and headers["retry-after"] == "1" and "no Triton replica is ready" in body["error"]["message"]
    finally:
        gateway.stop()

"""Overload and faults on a second real server with small queue limits:
admission control, the bounded tokenizer queue, the admin key, and a killed
encoder stub (the watchdog restarts the server). The kill test runs last.
Work that must still be in flight is kept there by the encoder's or the tokenizer's
test-only hold (testing/hold.py), so the verdicts do not depend on the machine's speed."""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from engine_lib.config import TokenizerConfig
from engine_lib.options import RequestOptions
from engine_lib.runner.self_check import MIN_COSINE
from engine_lib.tokenization.text import TextTokenizer
from rose_triton.server import REPO, TritonServer
from rose_wire import UNAVAILABLE, decode
from testing.embed_clients import embed_generate, embed_stream, embed_unary_grpc, embed_unary_http
from testing.gateway_process import GatewayProcess
from testing.hold import EncoderHold, TokenizerHold, wait_for_metric, wait_for_metric_zero
from testing.reliability_helpers import children, encode_ids, metric_value, watchdog_lines_naming
from testing.texts import LONG_TEXTS, MEDIUM_TEXTS

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests

ADMIN_KEY = "test-admin-key-0123456789"
LIMITS = {  # (model, parameter or queue size) -> value
    ("rose_encoder", "max_queued_tokens"): ("1048576", "6000"),
    ("rose_encoder", "max_queued_requests"): ("2048", "6"),
    ("tokenizer", "max_queue_size"): ("128", "2"),  # its dynamic batcher's queue
    ("embed", "count"): ("2", "1"),  # one instance: its in-flight bound is the front's
    ("embed", "max_requests_in_flight"): ("128", "2"),
    # Tokenizer settings the unary front must take from the tokenizer's config.pbtxt too.
    ("tokenizer", "max_texts_per_request"): ("4096", "16"),
    ("tokenizer", "query_prefix"): ("", "search_query: "),
}


def config_line(key, value):
    return f"{key}: {value}" if key in ("count", "max_queue_size") else f'"{key}", value: {{ string_value: "{value}" }}'


def small_limits_repository(dest):
    shutil.copytree(REPO / "model_repository", dest, ignore=shutil.ignore_patterns("__pycache__"))
    for (model, key), (old, new) in LIMITS.items():
        config = dest / model / "config.pbtxt"
        text = config.read_text()
        pattern = config_line(key, old)
        assert pattern in text, f"{config} no longer has {pattern}"
        config.write_text(text.replace(pattern, config_line(key, new)))
    return dest


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    folder = tmp_path_factory.mktemp("limited")
    hold, tokenizer_hold = EncoderHold(folder), TokenizerHold(folder)
    instance = TritonServer(folder / "server.log", serve_args=["--model-repository",
                                                               str(small_limits_repository(folder / "repo"))],
                            env={"ROSE_ADMIN_KEY": ADMIN_KEY, "ROSE_WATCHDOG_INTERVAL": "1", **hold.env,
                                 **tokenizer_hold.env},
                            gateway=True)
    instance.hold, instance.tokenizer_hold = hold, tokenizer_hold
    yield instance
    instance.kill()


def test_admin_apis_answer_only_with_the_key(limited):
    def stats(headers):
        request = urllib.request.Request(f"http://{limited.http_url}/v2/models/stats", headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=5).status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert stats({"rose-admin-key": ADMIN_KEY}) == 200
    assert stats({"rose-admin-key": "wrong-key-0123456789"}) == 403
    assert stats({}) == 403
    client = grpcclient.InferenceServerClient(limited.grpc_url)
    assert client.get_inference_statistics(headers={"triton-grpc-protocol-rose-admin-key": ADMIN_KEY})
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_inference_statistics()


def test_encoder_refuses_past_its_queue_at_once_and_accepted_ones_are_right(limited, model_dir, reference_model):
    """16 requests of ~1000 tokens (6 fill the queue) while the encoder is held: every refusal
    comes while the accepted ones are still queued (at once, not after the queue drained)."""
    tokenizer = TextTokenizer(model_dir, TokenizerConfig())
    texts = [LONG_TEXTS[i % 3] + f" request {i}" for i in range(4)]
    tokens = tokenizer.encode(texts, RequestOptions())
    input_ids, seq_lens = tokens.input_ids, tokens.seq_lens
    reference = reference_model.encode(texts, normalize_embeddings=True)
    outcomes: queue.Queue = queue.Queue()

    def one():
        rows, error = encode_ids(limited.grpc_url, input_ids, seq_lens, timeout=120)
        outcomes.put((rows, error, limited.hold.path.exists()))

    with limited.hold:
        wait_for_metric_zero(limited.metrics_url, "rose_queue_tokens", why="(before the requests)")
        for _ in range(16):
            threading.Thread(target=one, daemon=True).start()
        answered = []  # each request is refused (answered now) or queued (its tokens counted)
        deadline = time.monotonic() + 60
        while len(answered) < 16 and metric_value(limited.metrics_url, "rose_queue_tokens") \
                < (16 - len(answered)) * len(input_ids):
            assert time.monotonic() < deadline, f"{len(answered)} answered, the rest never queued"
            try:
                answered.append(outcomes.get(timeout=0.05))
            except queue.Empty:
                pass
    outcomes_after = [outcomes.get(timeout=120) for _ in range(16 - len(answered))]
    refused = [e for r, e, held in answered + outcomes_after if e is not None]
    accepted = [r for r, e, held in answered + outcomes_after if e is None]
    assert refused and accepted and len(refused) + len(accepted) == 16
    assert all(e is not None and held for _, e, held in answered), "an accepted request was answered while held"
    assert all(e is None for _, e, _ in outcomes_after), "a refusal waited for the queue to drain"
    assert all("overloaded: encoder queue is full" in str(e) for e in refused), refused[0]
    for rows in accepted:
        np.testing.assert_allclose((rows * reference).sum(1), 1, atol=1e-3)
    wait_for_metric(limited.metrics_url, "rose_refused_total", len(refused),
                    why="(rose_refused_total never counted the refusals)")


TOKENIZER_HOLDS = 1 + 2  # the tokenizer's request in hand (execute is held) + its queue's 2 (LIMITS)
EMBED_HOLDS = 2  # the embed front's one instance: the request it tokenizes + 1 more in flight (LIMITS)


def held_flood(hold, way, url, texts, count, can_hold, first):
    """`count` concurrent calls while the tokenizer is held, where at most `can_hold` calls can wait:
    -> (the first count - can_hold outcomes, all answered while held; the rest, after the release).
    An outcome is None (answered) or the client's error. `first` calls reach the hold one after
    another before the others start: one per tokenizing instance, so that the rest meet a full
    queue however slowly Triton hands requests to instances (and the tokenizer lane's group is
    that one request)."""
    outcomes: queue.Queue = queue.Queue()

    def one():
        try:
            way(url, texts)
            outcomes.put(None)
        except (InferenceServerException, urllib.error.HTTPError) as exc:
            outcomes.put(exc)

    with hold:
        for entered in range(1, first + 1):  # one at a time: a burst could overfill the queue before
            threading.Thread(target=one, daemon=True).start()  # Triton hands requests to idle instances
            hold.wait_entered(entered)
        for _ in range(count - first):
            threading.Thread(target=one, daemon=True).start()
        while_held = [outcomes.get(timeout=60) for _ in range(count - can_hold)]
    return while_held, [outcomes.get(timeout=120) for _ in range(can_hold)]


def test_tokenizer_queue_is_bounded(limited):
    refused, released = held_flood(limited.tokenizer_hold, embed_stream, limited.grpc_url, ["held"], 8,
                                   TOKENIZER_HOLDS, first=1)
    assert all(e is not None and "Exceeds maximum queue size" in str(e) for e in refused), refused
    assert all(decode(e.message()).code == UNAVAILABLE for e in refused), refused  # a stream's error has no status
    assert released == [None] * TOKENIZER_HOLDS  # the watchdog is paused: no probe takes a place


@pytest.mark.parametrize("way, status", [(embed_unary_grpc, "StatusCode.UNAVAILABLE"), (embed_unary_http, 503)])
def test_unary_front_bounds_its_requests_in_flight_and_reads_unavailable(limited, way, status):
    url = limited.grpc_url if "grpc" in way.__name__ else limited.http_url
    refused, released = held_flood(limited.tokenizer_hold, way, url, MEDIUM_TEXTS, 12, EMBED_HOLDS, first=1)
    for error in refused:
        assert error is not None and "overloaded: embed has 2 requests in flight" in str(error), error
        assert "max_requests_in_flight" in str(error), error
        assert (error.status() if status != 503 else int(error.status())) == status
    assert released == [None] * EMBED_HOLDS


def test_generate_reports_overload_as_400_with_a_readable_reason(limited):
    refused, released = held_flood(limited.tokenizer_hold, embed_generate, limited.http_url, MEDIUM_TEXTS, 8,
                                   TOKENIZER_HOLDS, first=1)
    for error in refused:
        assert error is not None and error.code == 400, error  # Triton 2.51's generate answers every error with 400
        assert "Exceeds maximum queue size" in error.read().decode()
    assert released == [None] * TOKENIZER_HOLDS, [e if e is None else e.read().decode() for e in released]


def test_unary_front_tokenizes_with_the_tokenizer_models_config(limited):
    """This server's tokenizer config.pbtxt has a query prefix and a 16-text limit: the unary
    front, which tokenizes itself, applies both as the ensemble does."""
    texts = MEDIUM_TEXTS[:3]
    query = {"input_type": "query"}
    streamed = embed_stream(limited.grpc_url, texts, query)
    np.testing.assert_allclose(embed_unary_grpc(limited.grpc_url, texts, query), streamed, atol=1e-6)
    np.testing.assert_allclose(embed_unary_http(limited.http_url, texts, query), streamed, atol=1e-6)
    assert (embed_unary_grpc(limited.grpc_url, texts) * streamed).sum(1).max() < MIN_COSINE  # prefix changed the ids
    too_many = [f"text {i}" for i in range(17)]
    for way, url in ((embed_unary_grpc, limited.grpc_url), (embed_unary_http, limited.http_url),
                     (embed_stream, limited.grpc_url)):
        with pytest.raises(InferenceServerException, match="TEXT has 17 texts; at most 16 per request"):
            way(url, too_many)


def server_rss_mib(serve_pid):
    """(current, peak) resident memory of tritonserver and its model stubs, in MiB."""
    (triton_pid, _), = [c for c in children(serve_pid) if "bin/tritonserver" in c[1]]
    current = peak = 0
    for pid in [triton_pid] + [p for p, _ in children(triton_pid)]:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        current += int(fields["VmRSS"].split()[0])
        peak += int(fields["VmHWM"].split()[0])
    return current / 1024, peak / 1024


def test_memory_stays_bounded_under_a_flood(limited, model_dir, record_property):
    texts = [LONG_TEXTS[i % 3] + f" flood {i}" for i in range(4)]
    tokens = TextTokenizer(model_dir, TokenizerConfig()).encode(texts, RequestOptions())
    input_ids, seq_lens = tokens.input_ids, tokens.seq_lens
    before, _ = server_rss_mib(limited.process.pid)
    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        with limited.hold:  # at most max_queued_requests (6) wait; every other request is refused meanwhile
            futures = [pool.submit(lambda: encode_ids(limited.grpc_url, input_ids, seq_lens)[1]) for _ in range(400)]
            for answered, _ in enumerate(as_completed(futures, timeout=300), start=1):
                if answered == 400 - 6:
                    break
        outcomes = [f.result(timeout=120) for f in futures]
    refused = sum(e is not None for e in outcomes)
    after, peak = server_rss_mib(limited.process.pid)
    summary = (f"flood: 400 requests of {int(seq_lens.sum())} tokens from 32 threads in "
               f"{time.monotonic() - started:.1f}s, {refused} refused; server RSS {before:.0f} MiB before, "
               f"{after:.0f} MiB after, peak {peak:.0f} MiB")
    print(summary)
    record_property("flood", summary)
    assert refused >= 400 - 6 and all("overloaded" in str(e) for e in outcomes if e is not None)
    assert after - before < 200, summary


def gateway_embed(gateway_url, texts):
    """POST /v1/embeddings -> (status, headers, body)."""
    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "float"}).encode()
    request = urllib.request.Request(f"{gateway_url}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


def test_gateway_answers_429_while_the_encoder_queue_is_full(limited, reference_model, tmp_path):
    """A gateway allowed 16 chunks in flight and one attempt per chunk, in front of an
    encoder that queues 6 requests: the overflow gets 429 + Retry-After, the rest is right."""
    gateway = GatewayProcess(tmp_path / "gateway.log", [limited.grpc_url],
                             ["--max-inflight-per-replica", "16", "--max-chunk-attempts", "1"])
    texts = [LONG_TEXTS[i % 3] + f" via the gateway {i}" for i in range(4)]  # ~1000 tokens: one chunk
    try:
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda _: gateway_embed(gateway.url, texts), range(16)))
    finally:
        gateway.stop()
    refused = [(h, b) for status, h, b in outcomes if status == 429]
    accepted = [b for status, _, b in outcomes if status == 200]
    assert refused and accepted and len(refused) + len(accepted) == 16, [o[0] for o in outcomes]
    for headers, body in refused:
        assert {k.lower(): v for k, v in headers.items()}["retry-after"] == "1"
        assert "overloaded" in body["error"]["message"] and body["error"]["code"] == "rate_limit_exceeded"
    reference = reference_model.encode(texts, normalize_embeddings=True)
    for body in accepted:
        rows = np.array([d["embedding"] for d in body["data"]])
        np.testing.assert_allclose((rows * reference).sum(1), 1, atol=1e-3)


def test_killed_encoder_stub_fails_in_flight_requests_and_the_server_recovers(limited, model_dir):
    (triton_pid, _), = [c for c in children(limited.process.pid) if "bin/tritonserver" in c[1]]
    (stub_pid, _), = [c for c in children(triton_pid) if "rose_encoder/1/model.py" in c[1]]
    outcomes: queue.Queue = queue.Queue()
    with ThreadPoolExecutor(4) as pool:  # the launcher's gateway opens a stream per slot before the kill
        assert [o[0] for o in pool.map(lambda i: gateway_embed(limited.gateway_url, [f"before {i}"]), range(4))] \
            == [200] * 4

    def texts_of(number):  # ~1000 tokens each: five fit the encoder's queue limits
        return [t + f" in flight {number}" for t in LONG_TEXTS] + LONG_TEXTS[:1]

    def call(way, url, number):
        try:
            way(url, texts_of(number))
            outcomes.put((way.__name__, "ok", time.monotonic()))
        except Exception as exc:  # any client error type counts: what matters is that it ends
            outcomes.put((way.__name__, repr(exc)[:80], time.monotonic()))

    tokenizer = TextTokenizer(model_dir, TokenizerConfig())
    paths = [(embed_stream, limited.grpc_url), (embed_unary_grpc, limited.grpc_url),
             (embed_unary_http, limited.http_url), (embed_generate, limited.http_url), (embed_stream, limited.grpc_url)]
    queued_tokens = 0
    with limited.hold:  # nothing can finish before the kill
        wait_for_metric_zero(limited.metrics_url, "rose_queue_tokens", why="(before the requests)")
        for number, path in enumerate(paths):  # one at a time: the small tokenizer and embed queues take each
            threading.Thread(target=call, args=(*path, number), daemon=True).start()
            queued_tokens += len(tokenizer.encode(texts_of(number), RequestOptions()).input_ids)
            wait_for_metric(limited.metrics_url, "rose_queue_tokens", queued_tokens,
                            why=f"(request {number}, {path[0].__name__}, never reached the encoder)")
        os.kill(stub_pid, signal.SIGKILL)
        killed_at = time.monotonic()
    results = [outcomes.get(timeout=60) for _ in paths]  # a hang fails here
    print(f"in flight at the kill: {[(way, outcome, round(t - killed_at, 1)) for way, outcome, t in results]}")
    assert all(outcome != "ok" for _, outcome, _ in results), results
    deadline = time.monotonic() + 120
    while not (limited.is_ready() and triton_pid not in [c[0] for c in children(limited.process.pid)]):
        assert time.monotonic() < deadline, f"server did not come back:\n{limited.log_tail()}"
        time.sleep(1)
    print(f"ready again {time.monotonic() - killed_at:.1f}s after the kill")
    assert embed_stream(limited.grpc_url, ["back again"]).shape == (1, 384)
    assert embed_unary_http(limited.http_url, ["back again"]).shape == (1, 384)
    # serve.sh kept the gateway; its streams to the old server are dead and get reopened
    status, _, body = gateway_embed(limited.gateway_url, ["back again"] * 3)
    assert status == 200 and len(body["data"]) == 3, body
    log = limited.log_tail(200_000)
    assert watchdog_lines_naming("rose_encoder_0_0", limited), log[-4000:]
    assert "[serve] a model stub died" in log

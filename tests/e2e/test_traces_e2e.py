"""Traces end to end: a tritonserver and a gateway of their own with the standard OTLP variables
set, sending to a real OTLP/HTTP receiver on loopback (decoded with opentelemetry-proto). One
request gives one trace under the client's `traceparent`: the gateway's spans, the encoder's,
linked parent to child; requests whose chunks share one encoder call keep separate traces."""
import base64
import concurrent.futures
import http.client
import json
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from rose_triton.server import TritonServer
from testing.gateway_process import GatewayProcess
from testing.hold import EncoderHold
from testing.waiting import wait_until

pytestmark = pytest.mark.own_server
MODEL = "all-MiniLM-L6-v2"
GATEWAY_STAGES = {"parse", "tokenize", "slot wait", "render", "encoder call"}
ENCODER_STAGES = {"queue wait", "batch formed", "step", "respond"}


def _value(any_value):
    return getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None


def decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """OTLP/HTTP in protobuf (the gateway's and the stubs' exporter) or JSON (Triton's: ids in hex,
    which protobuf's JSON mapping reads as base64)."""
    if "json" not in content_type:
        return ExportTraceServiceRequest.FromString(body)
    document = json.loads(body)
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for name in ("traceId", "spanId", "parentSpanId"):
                    if span.get(name):
                        span[name] = base64.b64encode(bytes.fromhex(span[name])).decode()
    return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)


class Receiver:
    """An OTLP/HTTP trace receiver: every span it is sent, with its service name."""

    def __init__(self):
        self.spans: list[dict] = []
        self.posts: list[str] = []  # each POST: its content type and span count, or why it was not read
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                content_type = self.headers.get("Content-Type", "")
                try:
                    request = decode(self.rfile.read(int(self.headers["Content-Length"])), content_type)
                except Exception as exc:
                    with receiver.lock:
                        receiver.posts.append(f"{content_type}: {exc!r}")
                    raise
                found = []
                for resource_spans in request.resource_spans:
                    resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            found.append({"trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                          "parent": span.parent_span_id.hex(), "name": span.name,
                                          "service": resource.get("service.name"),
                                          "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                                          "attributes": {kv.key: _value(kv.value) for kv in span.attributes}})
                with receiver.lock:
                    receiver.spans += found
                    receiver.posts.append(f"{content_type}: {len(found)} spans")
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace_id]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traced")
    receiver = Receiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    hold = EncoderHold(folder)
    server = TritonServer(folder / "server.log", env={**hold.env, **env})
    try:
        # one slot per replica: chunks that wait behind a held call share the next one
        gateway = GatewayProcess(folder / "gateway.log", [server.grpc_url],
                                 ["--workers", "1", "--max-inflight-per-replica", "1"], env=env)
    except Exception:
        server.kill()
        raise
    yield receiver, server, gateway, hold
    gateway.stop()
    server.kill()
    receiver.server.shutdown()


def post(gateway, body: dict, trace_id: str, parent_id: str):
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60)
    try:
        connection.request("POST", "/v1/embeddings", json.dumps(body),
                           {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{parent_id}-01"})
        response = connection.getresponse()
        return response.status, dict((k.lower(), v) for k, v in response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def complete(receiver: Receiver, trace_id: str, encoder_spans: int = 1):
    """The trace once the gateway's request span and every encoder span with its stages are in."""
    def ready():
        spans = receiver.trace(trace_id)
        names = [s["name"] for s in spans]
        done = (any(s["name"].startswith("POST ") for s in spans) and names.count("rose_encoder") >= encoder_spans
                and all(names.count(stage) >= encoder_spans for stage in ENCODER_STAGES))
        return spans if done else None
    return wait_until(ready, 60, lambda: f"the spans of trace {trace_id}; in: {arrived(receiver, trace_id)}", 0.05)


def arrived(receiver: Receiver, trace_id: str, server_log=None) -> str:
    """What a timed-out wait did get: each span of the trace as service/name, and the server log's
    lines about sending spans (the stubs' failed sends, Triton's OTLP client errors)."""
    spans = sorted(f"{s['service']}/{s['name']}" for s in receiver.trace(trace_id))
    lines = [line for line in server_log.read_text(errors="replace").splitlines()
             if "spans to" in line or "OTLP" in line] if server_log else []
    with receiver.lock:
        posts, latest = receiver.posts[-10:], receiver.spans[-10:]
    others = [f"{s['service']}/{s['name']} in {s['trace']}" for s in latest]
    return (f"{spans}; the server log on sending spans: {lines[-20:]}; the receiver's last POSTs: {posts}; "
            f"the last spans it got: {others}")


def check_linked(spans: list[dict], client_span: str) -> dict:
    """Every span's parent is in its trace (or the client's span); -> the spans by name."""
    ids = {s["id"] for s in spans}
    assert len(ids) == len(spans), "a span id twice in one trace"
    for span in spans:
        assert span["parent"] in ids or span["parent"] == client_span, span
    by_name: dict[str, list[dict]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    return by_name


def test_one_request_gives_one_trace_under_the_clients_context(traced):
    receiver, _, gateway, _ = traced
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    status, headers, body = post(gateway, {"model": MODEL, "input": ["one trace", "two texts"]}, trace_id,
                                 client_span)
    assert status == 200, body
    version, answered_trace, root_id, flags = headers["traceparent"].split("-")
    assert (version, answered_trace, flags) == ("00", trace_id, "01")
    spans = complete(receiver, trace_id)
    by_name = check_linked(spans, client_span)
    (root,) = by_name["POST /v1/embeddings"]
    assert (root["id"], root["parent"], root["service"]) == (root_id, client_span, "rose-gateway")
    assert root["attributes"]["rose.tokens"] == body["usage"]["prompt_tokens"]
    for name in GATEWAY_STAGES:
        assert [s["parent"] for s in by_name[name]] == [root_id], name
    (call,) = by_name["encoder call"]
    assert call["attributes"]["rose.chunk_texts"] == 2 and call["attributes"]["rose.coalesced"] is False
    (encoder,) = by_name["rose_encoder"]
    assert (encoder["parent"], encoder["service"]) == (call["id"], "rose-triton")
    assert encoder["attributes"]["rose.tokens"] == body["usage"]["prompt_tokens"]
    for name in ENCODER_STAGES:
        assert [s["parent"] for s in by_name[name]] == [encoder["id"]], name
    assert by_name["batch formed"][0]["attributes"]["rose.batch_sequences"] >= 2


def gateway_metric(gateway, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def test_requests_sharing_an_encoder_call_keep_their_own_traces(traced):
    receiver, _, gateway, hold = traced
    ids = {name: (secrets.token_hex(16), secrets.token_hex(8)) for name in "abc"}
    ids_input = [[101, 7592, 2088, 102]]  # 4 tokens each, as token ids
    with hold, concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, gateway, {"model": MODEL, "input": ids_input}, *ids["a"])
        wait_until(lambda: gateway_metric(gateway, "gateway_replica_inflight") >= 1, 60, "a's call in the encoder")
        waiting = [pool.submit(post, gateway, {"model": MODEL, "input": ids_input}, *ids[n]) for n in "bc"]
        wait_until(lambda: gateway_metric(gateway, "gateway_pending_tokens") >= 12, 60, "b and c queued behind a")
        hold.release()
        answers = [first.result(60)] + [w.result(60) for w in waiting]
    assert [a[0] for a in answers] == [200, 200, 200]
    traces = {n: check_linked(complete(receiver, ids[n][0]), ids[n][1]) for n in "abc"}
    for n in "bc":  # b's and c's chunks went in one call: each trace has its own encoder spans
        (call,) = traces[n]["encoder call"]
        assert call["attributes"]["rose.coalesced"] is True and call["attributes"]["rose.call_chunks"] == 2
        (encoder,) = traces[n]["rose_encoder"]
        assert encoder["parent"] == call["id"]
    span_ids = {n: {s["id"] for spans in traces[n].values() for s in spans} for n in "abc"}
    assert not span_ids["a"] & span_ids["b"] and not span_ids["b"] & span_ids["c"] and not span_ids["a"] & span_ids["c"]


def test_a_direct_triton_call_continues_the_clients_trace_into_the_encoder(traced):
    """Triton adopts a traceparent sent with a call (an HTTP header here: over gRPC metadata Triton 2.51
    starts a fresh trace for a few calls in a hundred, docs/operations.md); the unary front passes its
    trace on to the encoder (BLS), whose stub writes its stages under Triton's span of it."""
    import numpy as np
    import tritonclient.http as httpclient

    receiver, server, _, _ = traced
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a direct call"], dtype=np.object_))
    httpclient.InferenceServerClient(server.http_url).infer(
        "embed", [text], headers={"traceparent": f"00-{trace_id}-{client_span}-01"})

    def ready():
        spans = receiver.trace(trace_id)
        names = [s["name"] for s in spans]
        return spans if names.count("rose_encoder") == 2 and ENCODER_STAGES <= set(names) and "embed" in names else None
    spans = wait_until(ready, 60, lambda: "Triton's and the encoder's spans; in: "
                       f"{arrived(receiver, trace_id, server.log_path)}", 0.05)
    by_name = check_linked(spans, client_span)
    (front,) = by_name["embed"]
    triton_encoder = next(s for s in by_name["rose_encoder"] if s["service"] != "rose-triton")
    stub_encoder = next(s for s in by_name["rose_encoder"] if s["service"] == "rose-triton")
    assert triton_encoder["parent"] == front["id"] and stub_encoder["parent"] == triton_encoder["id"]
    for name in ENCODER_STAGES:
        assert [s["parent"] for s in by_name[name]] == [stub_encoder["id"]], name

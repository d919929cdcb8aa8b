"""The OpenTelemetry side of engine_lib/tracing.py, imported only when traces are on: the SDK's
tracer provider (sampler and resource from the standard variables), a batch span processor,
and an OTLP/HTTP exporter on the standard library's HTTP client (no extra HTTP stack); spans
written after the fact from recorded timestamps; W3C `traceparent` in and out."""
from __future__ import annotations

import logging
import os
import time
import urllib.request
from typing import Sequence

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

log = logging.getLogger("rose.tracing")


def traces_url(environ=os.environ) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces."""
    url = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return url or environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"


def _headers(environ=os.environ) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_(TRACES_)HEADERS: k=v,k=v."""
    text = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {urllib.request.unquote(k.strip()): urllib.request.unquote(v.strip()) for k, v in pairs}


class OtlpHttpExporter(SpanExporter):
    """Spans as one OTLP/HTTP protobuf POST per batch."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float = 10.0):
        self.url, self.headers, self.timeout_s = url, headers, timeout_s
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        if protocol != "http/protobuf":
            log.warning("OTLP protocol %r asked; spans are sent as http/protobuf to %s", protocol, url)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = encode_spans(spans).SerializeToString()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/x-protobuf", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                answer.read()
        except Exception as exc:  # the receiver down: spans dropped, serving goes on
            log.warning("sending %d spans to %s failed: %s", len(spans), self.url, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def make_tracer(service: str):
    """The tracer of `service` (OTEL_SERVICE_NAME, when set, names it instead)."""
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes))  # the sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OtlpHttpExporter(traces_url(), _headers())))
    return provider.get_tracer("rose")


def parse_traceparent(value: str):
    """The remote parent context of a W3C traceparent, or None when it is not one."""
    parts = value.strip().split("-")
    if len(parts) != 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
    return trace.set_span_in_context(NonRecordingSpan(parent))


def traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def wall_ns(perf_s: float, now_perf: float | None = None, now_ns: int | None = None) -> int:
    """A time.perf_counter() instant as epoch nanoseconds (what spans carry)."""
    now_perf = time.perf_counter() if now_perf is None else now_perf
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - int((now_perf - perf_s) * 1e9)


def stage_spans(tracer, parent_span, stages, attributes_of=None) -> None:
    """Child spans of `parent_span` from recorded instants: `stages` = [(name, start, end)]
    (perf_counter seconds; a stage with a 0 bound was not reached and is left out)."""
    now_perf, now_ns = time.perf_counter(), time.time_ns()
    context = trace.set_span_in_context(parent_span)
    for name, start, end in stages:
        if start and end:
            span = tracer.start_span(name, context=context, start_time=wall_ns(start, now_perf, now_ns),
                                     attributes=(attributes_of or {}).get(name))
            span.end(end_time=wall_ns(end, now_perf, now_ns))


def encoder_spans(tracer, model: str, parents: Sequence[str], request, sent_at: float, attributes: dict) -> None:
    """The encoder's spans of one answered request (engine_lib/service/batching.py's hop instants),
    once under each trace whose chunks it carried: `model` (arrival to answer sent) with children
    queue wait, batch formed (its last batch's sequences and tokens), step, respond."""
    now_perf, now_ns = time.perf_counter(), time.time_ns()
    sequences, tokens = request.batch
    for parent in parents:
        context = parse_traceparent(parent)
        if context is None:
            continue
        span = tracer.start_span(model, context=context, kind=trace.SpanKind.SERVER, attributes=attributes,
                                 start_time=wall_ns(request.received, now_perf, now_ns))
        stage_spans(tracer, span, [("queue wait", request.received, request.picked),
                                   ("batch formed", request.picked, request.launched),
                                   ("step", request.launched, request.ready),
                                   ("respond", request.ready, sent_at)],
                    {"batch formed": {"rose.batch_sequences": sequences, "rose.batch_tokens": tokens}})
        span.end(end_time=wall_ns(sent_at, now_perf, now_ns))


def triton_context(inference_trace) -> tuple[str, ...]:
    """The traceparent of Triton's own trace of a request (pb_utils.InferenceTrace.get_context(): JSON
    of the W3C headers in Triton's OpenTelemetry mode), or () when Triton does not trace it."""
    import json

    try:
        context = inference_trace.get_context() if inference_trace is not None else None
        value = json.loads(context).get("traceparent") if context else None
    except (ValueError, AttributeError, TypeError):
        return ()
    return (value,) if isinstance(value, str) and value else ()

"""The gateway's spans, imported only when traces are on (engine_lib/tracing.py): a request's
span continues the client's W3C `traceparent` (or starts a trace) and goes back on the answer;
its children are the stages of gateway/stages.py (parse, tokenize, slot wait, render) and one
span per encoder call (its chunk's texts and tokens, whether it shared the call with other
chunks), whose context goes to the encoder as the request parameter `traceparent`."""
from __future__ import annotations

import dataclasses

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from engine_lib.otel import parse_traceparent, stage_spans, traceparent, wall_ns
from engine_lib.tracing import PARAMETER
from rose_client.coalesce import Merge

from .stages import RequestRecord


def start(tracer, method: str, path: str, incoming: str, record: RequestRecord) -> None:
    parent = parse_traceparent(incoming) if incoming else None
    record.span = tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER,
                                    attributes={"http.request.method": method, "url.path": path},
                                    start_time=wall_ns(record.started))
    record.trace_id = f"{record.span.get_span_context().trace_id:032x}"


def end(tracer, record: RequestRecord, status: int) -> str:
    """End the request's span with its stages; -> its traceparent for the answer."""
    span = record.span
    stage_spans(tracer, span, [("parse", record.started, record.parsed),
                               ("tokenize", record.parsed, record.dispatched),
                               ("slot wait", record.dispatched, record.first_sent),
                               ("render", record.answered, record.finished)])
    span.set_attribute("http.response.status_code", status)
    for name, value in (("rose.key", record.key_name), ("rose.model", record.model)):
        if value:
            span.set_attribute(name, value)
    span.set_attribute("rose.inputs", record.inputs)
    span.set_attribute("rose.tokens", record.tokens)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    return traceparent(span)


class CallSpans:
    """The encoder-call spans of one request's chunks: opened when a chunk's call is built (the
    dispatcher sends it next), ended with its answer; a chunk tried again ends its last span as failed."""

    def __init__(self, tracer, record: RequestRecord, payload_of):
        self.tracer, self.payload_of = tracer, payload_of
        self.context = trace.set_span_in_context(record.span)
        self.open: dict[int, tuple] = {}     # chunk index -> (span, id of its call)
        self.results: dict[int, object] = {}

    def sent(self, chunk):
        call = self.payload_of(chunk)
        self._close(chunk.index, failed=True)
        span = self.tracer.start_span("encoder call", context=self.context, kind=SpanKind.CLIENT,
                                      attributes={"rose.triton_model": call.model, "rose.chunk_texts": chunk.num_texts,
                                                  "rose.chunk_tokens": chunk.num_tokens, "rose.coalesced": False})
        call = dataclasses.replace(call, parameters={**(call.parameters or {}), PARAMETER: traceparent(span)})
        self.open[chunk.index] = (span, id(call))
        _SPAN_OF_CALL[id(call)] = span
        return call

    def answered(self, chunk, result) -> None:
        self.results[chunk.index] = result
        self._close(chunk.index)

    def _close(self, index: int, failed: bool = False) -> None:
        span, call_id = self.open.pop(index, (None, None))
        if span is not None:
            _SPAN_OF_CALL.pop(call_id, None)
            if failed:
                span.set_status(Status(StatusCode.ERROR, "the call failed; the chunk was tried again or dropped"))
            span.end()

    def close(self) -> None:
        for index in list(self.open):
            self._close(index, failed=True)


_SPAN_OF_CALL: dict[int, object] = {}  # id(Call) -> its span, while the call is being merged or sent


@dataclasses.dataclass(frozen=True)
class TracedMerge(Merge):
    """Merge that keeps each call's `traceparent`: the shared call carries them all (comma-separated),
    so the encoder writes its spans under every trace; each call's span learns it was coalesced."""

    def combine(self, calls):
        contexts = []
        stripped = []
        for call in calls:
            params = dict(call.parameters or {})
            contexts.append(params.pop(PARAMETER, ""))
            stripped.append(dataclasses.replace(call, parameters=params))
            span = _SPAN_OF_CALL.pop(id(call), None)
            if span is not None:
                span.set_attribute("rose.coalesced", True)
                span.set_attribute("rose.call_chunks", len(calls))
        combined = super().combine(stripped)
        return dataclasses.replace(combined, parameters={**(combined.parameters or {}),
                                                         PARAMETER: ",".join(c for c in contexts if c)})


def traced_merge(merge: Merge | None) -> Merge | None:
    return None if merge is None else TracedMerge(**{f.name: getattr(merge, f.name) for f in dataclasses.fields(merge)})


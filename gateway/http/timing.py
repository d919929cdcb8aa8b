"""Per request: TEI's timing headers on the answer, and one JSON line in the access log.
What each figure measures is the stage boundaries of gateway/stages.py; docs/operations.md,
"Timing headers and the access log", says it for operators."""
from __future__ import annotations

import os
import re
import sys
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from engine_lib import tracing

from ..stages import RequestRecord

TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def incoming_trace_id(request: Request) -> str | None:
    """The trace id of the request's W3C `traceparent`, for the access log (tracing on or off)."""
    match = TRACEPARENT.fullmatch(request.headers.get("traceparent", "").strip())
    return match.group(1) if match and match.group(1) != "0" * 32 else None


def timing_headers(record: RequestRecord) -> dict[str, str]:
    """TEI's names, whole milliseconds as TEI sends them (0: the stage was not reached)."""
    return {"x-total-time": str(int(record.total_ms)), "x-tokenization-time": str(int(record.tokenization_ms)),
            "x-queue-time": str(int(record.queue_ms)), "x-inference-time": str(int(record.inference_ms)),
            "x-compute-tokens": str(record.tokens)}


def access_line(request: Request, response: Response, record: RequestRecord) -> bytes:
    """The access log's line: who, which model, how much, the status and the stage times; never
    the request's text."""
    return orjson.dumps({
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
        "method": request.method, "path": request.url.path, "status": response.status_code,
        "key": record.key_name, "model": record.model, "inputs": record.inputs, "tokens": record.tokens,
        "total_ms": round(record.total_ms, 3), "tokenization_ms": round(record.tokenization_ms, 3),
        "queue_ms": round(record.queue_ms, 3), "inference_ms": round(record.inference_ms, 3),
        "trace_id": record.trace_id})


class AccessLog:
    """`target`: '-' (standard error), 'off', or a file appended to. One write per line, unbuffered:
    lines of several worker processes never interleave (O_APPEND, or one pipe write each)."""

    def __init__(self, target: str):
        self.fd = None
        if target == "-":
            self.fd = sys.stderr.fileno()
        elif target != "off":
            self.fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, request: Request, response: Response, record: RequestRecord) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, access_line(request, response, record) + b"\n")
            except OSError:  # a full disk or a closed pipe costs the line, never the answer
                pass


def finish(request: Request, response: Response, record: RequestRecord, access_log: AccessLog) -> None:
    """Stamp the answer: the timing headers and the record's own (rate limits), then the log line."""
    record.finished = time.perf_counter()
    headers = timing_headers(record)
    if record.span is not None:  # traces on
        from .. import traced

        headers["traceparent"] = traced.end(tracing.tracer(""), record, response.status_code)
    headers.update(record.extra_headers)
    # appended as raw pairs: none of these names is set before (MutableHeaders would rescan per name)
    response.raw_headers.extend((name.encode(), value.encode()) for name, value in headers.items())
    access_log.write(request, response, record)

"""Traces (OpenTelemetry), off unless the standard variables turn them on:
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT (OTLP over HTTP/protobuf),
with OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
read by the SDK as usual; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep them off.

Off, nothing of OpenTelemetry is imported (engine_lib/otel.py holds everything that needs it)
and every hook is one `is None` test. The gateway passes a request's context to the encoders
as the request parameter `traceparent` (W3C; several, comma-separated, when chunks of several
requests share one call), which `split_parameters` takes out of the parameters before the
options are read, tracing on or off."""
from __future__ import annotations

import json
import os
from typing import Optional

PARAMETER = "traceparent"


def enabled(environ=os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def split_parameters(parameters) -> tuple[object, tuple[str, ...]]:
    """(`parameters` less `traceparent`, its contexts). `parameters`: Triton's JSON text or a dict;
    without the name it is returned as it came (a text is not parsed)."""
    if not parameters or PARAMETER not in parameters:
        return parameters, ()
    params = dict(json.loads(parameters) if isinstance(parameters, str) else parameters)
    value = params.pop(PARAMETER)
    contexts = tuple(c.strip() for c in value.split(",") if c.strip()) if isinstance(value, str) else ()
    return params, contexts


_tracer = None
_checked = False


def tracer(service: str) -> Optional[object]:
    """This process's tracer (the SDK set up once, spans sent in the background), or None when off."""
    global _tracer, _checked
    if not _checked:
        _checked = True
        if enabled():
            from engine_lib.otel import make_tracer

            _tracer = make_tracer(service)
    return _tracer

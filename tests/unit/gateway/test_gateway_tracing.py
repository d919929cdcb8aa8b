"""Traces off cost nothing: without the OTLP variables no OpenTelemetry module is loaded, by the
gateway answering a request (its in-process replica, as test_gateway_api.py runs it) or by the
encoder's service; the switch and the encoder's parameter split (engine_lib/tracing.py)."""
import os
import subprocess
import sys

import pytest

from engine_lib.tracing import enabled, split_parameters
from testing import REPO

OFF_SCRIPT = """
import sys
import tests.unit.gateway.test_gateway_api as api
import engine_lib.service.batching, engine_lib.service.endpoint
response, replica = api.post("/v1/embeddings", {"model": api.MODEL, "input": ["traces off"]},
                             headers={"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})
assert response.status_code == 200, response.text
assert "traceparent" not in response.headers and "traceparent" not in replica.calls[0].parameters
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m in ("gateway.traced", "engine_lib.otel"))
assert not loaded, loaded
print("off")
"""


def test_traces_off_load_nothing_of_opentelemetry():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", OFF_SCRIPT], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("off"), done.stderr[-3000:]


@pytest.mark.parametrize("environ, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_SERVICE_NAME": "rose"}, False),
])
def test_the_standard_variables_turn_traces_on(environ, on):
    assert enabled(environ) is on


def test_the_encoder_takes_the_contexts_out_of_its_parameters():
    text = '{"dimensions": 64}'
    assert split_parameters(text) == (text, ())  # no context: the text is not even parsed
    assert split_parameters('{"dimensions": 64, "traceparent": "00-a-b-01, 00-c-d-01"}') == (
        {"dimensions": 64}, ("00-a-b-01", "00-c-d-01"))
    assert split_parameters({"traceparent": "00-a-b-01"}) == ({}, ("00-a-b-01",))
    assert split_parameters(None) == (None, ())

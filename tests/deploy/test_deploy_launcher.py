"""The container's start path, run here: scripts/serve.sh with ROSE_SKIP_SETUP=1
(tritonserver found on PATH, as in the image), the image's environment, the
ConfigMap's settings and the tritonserver flags of the image's CMD."""
import json
import os
import queue
import re
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from rose_triton.server import REPO, TritonServer, free_port
from testing.dockerfile import image_env, instructions
from testing.embed_clients import embed_stream
from testing.hold import EncoderHold, wait_for_metric
from testing.waiting import wait_until

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests

TRITON_HOME = REPO / "build" / "pytriton" / "tritonserver"


def container_env() -> dict[str, str]:
    """The image's ENV and the ConfigMap's settings, and what the image provides natively."""
    if not (TRITON_HOME / "bin" / "tritonserver").exists():
        pytest.fail("no local Triton: run scripts/setup.sh first")
    (configmap,) = yaml.safe_load_all((REPO / "docker" / "k8s" / "configmap.yaml").read_text())
    return {**{k: v for k, v in image_env().items() if "$" not in v}, **configmap["data"],
            # what the image provides natively: tritonserver on PATH, its backends, libpython
            "PATH": f"{TRITON_HOME / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "TRITON_BACKEND_DIR": str(TRITON_HOME / "backends"),
            "LD_LIBRARY_PATH": sysconfig.get_config_var("LIBDIR"),
            "ROSE_VENV": "/nonexistent"}  # were setup.sh to run, it would fail on this


@pytest.fixture(scope="module")
def container_mode_server(tmp_path_factory):
    env = container_env()
    command = json.loads([args for kw, args in instructions() if kw == "CMD"][0])
    tritonserver_flags = command[command.index("--") + 1:]
    folder = tmp_path_factory.mktemp("container")
    hold = EncoderHold(folder)
    # The pod's models file (models-configmap.yaml, mounted where ROSE_MODELS_FILE points): none by name.
    (models,) = yaml.safe_load_all((REPO / "docker" / "k8s" / "models-configmap.yaml").read_text())
    (folder / "models.yaml").write_text(models["data"]["models.yaml"])
    env["ROSE_MODELS_FILE"] = str(folder / "models.yaml")
    env["ROSE_GATEWAY_DATA_DIR"] = str(folder / "gateway-data")  # the image's own folder is made in the image
    server = TritonServer(folder / "server.log", env={**env, **hold.env},
                          extra_args=tritonserver_flags, gateway=True)  # `docker run` starts both
    server.hold = hold
    yield server
    server.kill()


def test_container_start_path_serves(container_mode_server, reference_model):
    texts = ["container mode", "ConfigMap settings reach the engine"]
    rows = embed_stream(container_mode_server.grpc_url, texts)
    reference = reference_model.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose((rows * reference).sum(1), 1, atol=1e-3)


def test_container_start_path_runs_the_gateway(container_mode_server, reference_model):
    texts = ["the gateway in the image"]
    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "float"}).encode()
    request = urllib.request.Request(f"{container_mode_server.gateway_url}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        rows = np.array([d["embedding"] for d in json.load(response)["data"]])
    reference = reference_model.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose((rows * reference).sum(1), 1, atol=1e-3)


def test_the_image_command_refuses_an_open_gateway_without_keys():
    """The image's CMD listens on 0.0.0.0: without API keys (or
    ROSE_GATEWAY_ALLOW_UNAUTHENTICATED=1) serve.sh stops before anything starts."""
    command = json.loads([args for kw, args in instructions() if kw == "CMD"][0])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_GATEWAY")}
    ports = [str(free_port()) for _ in range(4)]
    args = ["--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2], "--gateway-port", ports[3]]
    result = subprocess.run([str(REPO / "scripts" / "serve.sh"), "--host", "0.0.0.0", *args],
                            env={**env, **container_env()}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "no API key is set" in result.stderr and "ROSE_GATEWAY_ALLOW_UNAUTHENTICATED=1" in result.stderr
    assert "[serve] HTTP" not in result.stderr  # stopped before starting Triton


def test_sigterm_finishes_the_request_in_flight(container_mode_server):
    """Kubernetes sends SIGTERM to the container's main process (serve.sh, which
    passes it on to tritonserver); what is in flight must still be answered. The
    encoder's test-only hold keeps the request queued until tritonserver reports it
    waiting for it, whatever the machine's pace."""
    server = container_mode_server
    texts = [f"request {i} in flight while the pod is told to stop" for i in range(40)]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    text = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    waiting = re.compile(r"'ensemble' \(version 1\) has [1-9]\d* in-flight")
    with server.hold:
        client.async_stream_infer("ensemble", [text])
        wait_for_metric(server.metrics_url, "rose_queue_requests", 1, why="(the request never reached the encoder)")
        os.kill(server.process.pid, signal.SIGTERM)
        def triton_waits():
            assert responses.empty(), "answered while held"
            return waiting.search(server.log_tail(200_000))

        wait_until(triton_waits, 60, lambda: f"tritonserver to wait for the request:\n{server.log_tail()}", 0.1)
    result, error = responses.get(timeout=120)
    client.stop_stream()  # an open stream would hold the ensemble until --exit-timeout-secs
    client.close()
    assert error is None and result.as_numpy("EMBEDDINGS").shape == (len(texts), 384)
    assert server.process.wait(180) == 0, server.log_tail()  # a bound for a hang, not a speed target

"""What the default server exposes: inference, health and metadata only;
admin APIs refused without the secret header; loopback only."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from rose_triton.server import REPO
from testing.reliability_helpers import children

ADMIN_HTTP = [  # (method, path, body) of every admin API family Triton 2.51 has
    ("GET", "/v2/models/stats", None),
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/embed/unload", {}),
    ("POST", "/v2/repository/models/embed/load", {}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/region/x/register", {"key": "/x", "offset": 0, "byte_size": 8}),
    ("GET", "/v2/cudasharedmemory/status", None),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/logging", {"log_verbose_level": 1}),
]


def http(server, method, path, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("method, path, body", ADMIN_HTTP)
def test_http_admin_api_refused_without_the_key(server, method, path, body):
    for headers in ({}, {"rose-admin-key": "guess-0123456789abcdef"}):
        status, text = http(server, method, path, body, headers)
        assert status == 403 and "restricted" in text, (status, text)


def test_grpc_admin_api_refused_without_the_key(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    calls = [client.get_inference_statistics, client.get_model_repository_index,
             lambda **kw: client.unload_model("embed", **kw), client.get_system_shared_memory_status,
             client.get_cuda_shared_memory_status, client.get_trace_settings, client.get_log_settings,
             lambda **kw: client.update_log_settings({"log_verbose_level": 1}, **kw)]
    for call in calls:
        for headers in (None, {"triton-grpc-protocol-rose-admin-key": "guess-0123456789abcdef"}):
            with pytest.raises(InferenceServerException, match="restricted"):
                call(headers=headers)
    assert client.is_server_ready() and client.is_model_ready("embed")


def test_inference_health_and_metadata_stay_open(server):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/ensemble/ready", "/v2",
                 "/v2/models/ensemble", "/v2/models/embed/config"):
        assert http(server, "GET", path)[0] == 200, path
    status, text = http(server, "POST", "/v2/models/ensemble/generate", {"TEXT": ["open"]})
    assert status == 200 and len(json.loads(text)["EMBEDDINGS"]) == 384


def listening_addresses(port):
    """Local addresses with a listening TCP socket on `port` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port_hex = local.rsplit(":", 1)
                if state == "0A" and int(port_hex, 16) == port:  # 0A = LISTEN
                    found.add(address)
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 as IPv4 and IPv4-mapped IPv6


def test_server_listens_on_loopback_only(server):
    gateway_port = int(server.gateway_url.rsplit(":", 1)[1])  # the launcher's gateway too
    for port in (server.http_port, server.grpc_port, server.metrics_port, gateway_port):
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, (port, addresses)


def test_model_control_stays_none(server):
    (_, cmdline), = [c for c in children(server.process.pid) if "bin/tritonserver" in c[1]]
    assert "--model-control-mode none" in cmdline


@pytest.mark.parametrize("key", ["short", "has space in it 0123456789", "colon:0123456789abcdef"])
def test_serve_refuses_a_weak_or_unparseable_key(key):
    result = subprocess.run([str(REPO / "scripts" / "serve.sh")], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "ROSE_SKIP_SETUP": "1", "ROSE_ADMIN_KEY": key,
                                 "HOME": "/tmp"})
    assert result.returncode == 2 and "admin key must be" in result.stderr

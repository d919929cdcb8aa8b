"""Supervision under scripts/serve.sh, on a server of its own: a killed gateway is started
again; a SIGSTOPped encoder stub, or a killed `embed` instance that is not the first, gets
the server restarted by the watchdog, and no process of the old server is left (the stopped
stub included); stopping serve.sh stops it all.
Every wait polls a condition until a deadline."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rose_triton.server import REPO, TritonServer
from testing.embed_clients import embed_stream, embed_unary_grpc, embed_unary_http
from testing.reliability_helpers import children, watchdog_lines_naming
from testing.waiting import wait_until

pytestmark = pytest.mark.own_server  # its own servers: scripts/test.sh runs it beside the shared-server tests

DEADLINE_S = 180


@pytest.fixture(scope="module")
def supervised(tmp_path_factory):
    instance = TritonServer(tmp_path_factory.mktemp("supervised") / "server.log", gateway=True,
                            env={"ROSE_WATCHDOG_INTERVAL": "1", "ROSE_WATCHDOG_TIMEOUT": "5"})
    yield instance
    instance.kill()


def descendants(pid):
    """(pid, command line) of every process below `pid`."""
    found = []
    for child in children(pid):
        found += [child] + descendants(child[0])
    return found


def start_time(pid):
    """The process's start time (clock ticks after boot), or None if it is gone or a zombie
    (a zombie holds no memory: it only waits for its parent to read its exit status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def wait_for(condition, what, server):
    return wait_until(condition, DEADLINE_S, lambda: f"{what}:\n{server.log_tail()}", 0.5)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def gateway_embed(gateway_url, texts):
    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts}).encode()
    request = urllib.request.Request(f"{gateway_url}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.load(response)


def gateway_pids(server):
    return [pid for pid, cmd in descendants(server.process.pid) if "-m gateway" in cmd]


def test_every_served_model_answers_the_watchdogs_probe(supervised):
    spec = importlib.util.spec_from_file_location("watchdog", REPO / "scripts" / "watchdog.py")
    watchdog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watchdog)
    for model in watchdog.served_models(rerank=False):
        assert watchdog.probe(f"http://{supervised.http_url}", model, 60) == (watchdog.OK, ""), model


def test_a_killed_gateway_is_started_again(supervised):
    (old,) = gateway_pids(supervised)
    assert get(f"{supervised.gateway_url}/livez") == 200
    os.kill(old, signal.SIGKILL)

    def new_gateway():
        pids = gateway_pids(supervised)
        return pids if pids and old not in pids and supervised.is_ready() else None

    (new,) = wait_for(new_gateway, "no new gateway answered", supervised)
    assert start_time(old) is None
    assert get(f"{supervised.gateway_url}/livez") == 200
    status, body = gateway_embed(supervised.gateway_url, ["back again", "and again"])
    assert status == 200 and len(body["data"]) == 2
    assert "[serve] the gateway exited (status 137); starting it again" in supervised.log_tail(200_000)


def test_a_stopped_encoder_stub_gets_the_server_restarted_leaving_no_old_process(supervised):
    (triton_pid, _), = [c for c in children(supervised.process.pid) if "bin/tritonserver" in c[1]]
    old_server = {pid: start_time(pid) for pid in [triton_pid] + [p for p, _ in descendants(triton_pid)]}
    (stub_pid, _), = [c for c in children(triton_pid) if "rose_encoder/1/model.py" in c[1]]
    os.kill(stub_pid, signal.SIGSTOP)  # hangs: it answers nothing, not even Triton's health checks

    def restarted():
        servers = [pid for pid, cmd in children(supervised.process.pid) if "bin/tritonserver" in cmd]
        return servers and triton_pid not in servers and supervised.is_ready()

    try:
        wait_for(restarted, "the server was not restarted", supervised)
        wait_for(lambda: all(start_time(pid) != start for pid, start in old_server.items()),
                 f"processes of the old server are left: {old_server}", supervised)
    finally:  # never leave a stopped process behind, even when the test fails
        if start_time(stub_pid) == old_server[stub_pid]:
            os.kill(stub_pid, signal.SIGKILL)
    assert embed_stream(supervised.grpc_url, ["after the restart"]).shape == (1, 384)
    status, body = gateway_embed(supervised.gateway_url, ["after the restart"])  # the gateway found it
    assert status == 200 and len(body["data"]) == 1
    log = supervised.log_tail(200_000)
    assert "[watchdog]" in log and "[serve] a model stub died or hung" in log


def stub_of(triton_pid, instance):
    """The pid of model instance `instance`'s stub (its name is on the stub's command line)."""
    (pid,) = [p for p, cmd in children(triton_pid) if "triton_python_backend_stub" in cmd and f" {instance} " in cmd]
    return pid


def test_a_killed_instance_that_is_not_the_first_is_healed(supervised, reference_model):
    """Triton hands a request to any free `embed` instance, so probes alone may never meet the
    dead one: the watchdog watches every stub process. Calls in flight around the kill end
    (answer or error, no hang); after the restart 20 calls in a row succeed, with right rows."""
    texts = ["healed after a kill", "a second text"]
    reference = reference_model.encode(texts, normalize_embeddings=True)
    (triton_pid, _), = [c for c in children(supervised.process.pid) if "bin/tritonserver" in c[1]]
    stub_pid = stub_of(triton_pid, "embed_0_1")
    stop_calling, ended = threading.Event(), []

    def keep_calling():  # each call has a client deadline: one that never ended would fail below
        while not stop_calling.is_set():
            try:
                embed_unary_http(supervised.http_url, texts)
                ended.append("ok")
            except Exception as exc:  # refused, reset, 500 from the dead stub: all end
                ended.append(type(exc).__name__)
                time.sleep(0.2)  # no busy loop against a server that is down

    with ThreadPoolExecutor(4) as pool:
        callers = [pool.submit(keep_calling) for _ in range(4)]
        os.kill(stub_pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def restarted():
            servers = [pid for pid, cmd in children(supervised.process.pid) if "bin/tritonserver" in cmd]
            return servers and triton_pid not in servers and supervised.is_ready()

        wait_for(restarted, "the server was not restarted", supervised)
        stop_calling.set()
        for caller in callers:
            caller.result(timeout=180)
    for _ in range(20):
        rows = embed_unary_grpc(supervised.grpc_url, texts)
        np.testing.assert_allclose((rows * reference).sum(1), 1, atol=1e-3)
    print(f"20 calls in a row succeeded {time.monotonic() - killed_at:.1f} s after the kill; "
          f"{len(ended)} calls ended around it")
    # the stub watch names it; a probe round in flight at the kill may have met the dead instance first
    assert watchdog_lines_naming("embed_0_1", supervised), supervised.log_tail()


def test_stopping_serve_sh_stops_the_gateway_and_its_loop(supervised):
    port = supervised.gateway_url.rsplit(":", 1)[1]
    ours = [(pid, start_time(pid)) for pid, cmd in descendants(supervised.process.pid)
            if f"--gateway-port {port}" in cmd or ("-m gateway" in cmd and f"--port {port}" in cmd)]
    assert len(ours) == 2, ours  # the gateway and the loop (a subshell of serve.sh) that restarts it
    # the Python backend's regions carry this server's prefix (the helper removes what a killed stub left)
    assert glob.glob(f"/dev/shm/{supervised.shm_prefix}*")
    supervised.stop()
    assert not glob.glob(f"/dev/shm/{supervised.shm_prefix}*") and not os.path.exists(supervised.tmpdir)
    # serve.sh waits for the gateway's loop before it exits; nothing is left to start a gateway again
    assert all(start_time(pid) != start for pid, start in ours), ours
    assert get_refused(supervised.gateway_url)


def get_refused(url):
    try:
        urllib.request.urlopen(f"{url}/livez", timeout=10)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False

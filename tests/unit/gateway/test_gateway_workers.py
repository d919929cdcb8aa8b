"""`python -m gateway --workers 2` (gateway/workers.py): two processes on one port, shared
metrics, a dead worker replaced, SIGTERM stops them all. No Triton behind it (/health 503)."""
import http.client
import os
import re
import signal
from pathlib import Path

import pytest

from gateway.config import GatewayConfig, parse_args, usable_cpus
from gateway.workers import per_worker
from testing.gateway_process import GatewayProcess
from testing.waiting import wait_until


def workers_of(pid: int) -> list[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def wait_for(condition, what: str, timeout: float = 120.0):
    return wait_until(condition, timeout, what, interval=0.1)


def get(port: int, path: str) -> tuple[int, bytes]:
    """On a new connection each time: the kernel picks the worker."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def models_answered(port: int) -> float:
    _, body = get(port, "/metrics")
    found = re.search(rb'gateway_requests_total\{endpoint="models",status="200"\} (\S+)', body)
    return float(found.group(1)) if found else 0.0


def test_bounds_are_divided_among_the_workers():
    config = per_worker(GatewayConfig(max_concurrent_requests=5, max_pending_tokens=1000, max_inflight_per_replica=4,
                                      max_receiving_connections=9, max_receiving_per_client=3,
                                      max_body_bytes=1000, max_buffered_body_bytes=1500, workers=2), 2)
    assert (config.max_concurrent_requests, config.max_pending_tokens, config.max_inflight_per_replica,
            config.max_receiving_connections, config.max_receiving_per_client, config.workers) == (3, 500, 2, 5, 2, 1)
    assert config.max_buffered_body_bytes == 1000  # 750 would refuse a body of the largest size


def test_the_number_of_workers(monkeypatch, tmp_path):
    monkeypatch.setenv("ROSE_GATEWAY_WORKERS", "3")
    assert parse_args([]).workers == 3 and parse_args(["--workers", "2"]).workers == 2
    with pytest.raises(ValueError, match="workers must be >= 1"):
        parse_args(["--workers", "0"])
    cpu_max, cpus = tmp_path / "cpu.max", len(os.sched_getaffinity(0))
    cpu_max.write_text("150000 100000\n")  # a container limited to 1.5 CPUs
    assert usable_cpus(str(cpu_max)) == min(cpus, 2)
    cpu_max.write_text("max 100000\n")
    assert usable_cpus(str(cpu_max)) == cpus
    monkeypatch.delenv("ROSE_GATEWAY_WORKERS")
    assert parse_args([]).workers == min(4, max(1, usable_cpus() // 2))


def test_two_workers_share_the_port_and_the_metrics(tmp_path):
    log = tmp_path / "gateway.log"
    gateway = GatewayProcess(log, ["127.0.0.1:1"], args=["--workers", "2"], wait_ready=False, timeout=120)
    try:
        def ready_lines():
            return re.findall(r"\[gateway (w\d)\][^\n]*gateway ready", log.read_text(errors="replace"))
        wait_for(lambda: len(ready_lines()) == 2, "both workers to start")
        first = workers_of(gateway.process.pid)
        assert len(first) == 2
        for _ in range(20):
            assert get(gateway.port, "/v1/models")[0] == 200
        assert models_answered(gateway.port) == 20  # whichever worker answers, it counts both
        assert get(gateway.port, "/livez")[0] == 200 and get(gateway.port, "/health")[0] == 503

        os.kill(first[0], signal.SIGKILL)
        replaced = wait_for(lambda: (w := workers_of(gateway.process.pid)) and len(w) == 2 and first[0] not in w and w,
                            "the dead worker to be replaced")
        wait_for(lambda: len(ready_lines()) == 3, "the new worker to start")
        for _ in range(10):
            assert get(gateway.port, "/livez")[0] == 200
    finally:
        status = gateway.stop()
    assert status == 0, gateway.log_tail()
    assert not any(Path(f"/proc/{pid}").exists() for pid in replaced)

"""`python -m perf.stalled_uploads`: good requests' latency through the gateway while
1,000 uploads stall and 1,000 kept-alive connections sit idle, against the same gateway
with none, in one run (rounds of an idle phase, then a loaded one).

A stalled upload sent its headers and 20 of its 1,000 body bytes, from one of 20 loopback
addresses (50 each, under --max-receiving-per-client); an idle connection had one request
answered and stays open. The gateway runs its default bounds, with its header, body and
keep-alive timeouts raised to 600 s so that the connections last the run. Good requests are
sequential batch-1 /v1/embeddings of one short text on a kept-alive connection. Writes
perf/results/<date>-<machine>/stalled-uploads.{json,md}."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import tempfile
import time
from pathlib import Path

from . import machine
from .lineup import REPO
from .measure import latency_stats

TEXT = "A stalled upload holds a connection, never a request slot."
ADDRESSES = 20  # 127.0.1.1 .. : the stalled uploads' source addresses


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        for line in connection.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        connection.close()
    raise RuntimeError(f"{name} not in /metrics")


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def stall(port: int, index: int) -> socket.socket:
    source = f"127.0.1.{1 + index % ADDRESSES}"
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n" + b'{"model": "all-MiniL')
    return sock


def idle(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/health")
    connection.getresponse().read()
    return connection


def good_latencies(port: int, num: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": [TEXT]})
    latencies = []
    try:
        for i in range(num + 5):
            start = time.perf_counter()
            connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            rows = json.loads(response.read())["data"]
            if response.status != 200 or len(rows) != 1:
                raise RuntimeError(f"a good request got {response.status}")
            if i >= 5:  # the first 5 warm up
                latencies.append((time.perf_counter() - start) * 1e3)
    finally:
        connection.close()
    return latencies


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.stalled_uploads", description=__doc__.splitlines()[0])
    parser.add_argument("--stalled", type=int, default=1000)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=150, help="good requests per phase")
    parser.add_argument("--rounds", type=int, default=3, help="of an idle phase, then a loaded one")
    parser.add_argument("--out", help="output folder (default: perf/results/<date>-<machine>)")
    args = parser.parse_args(argv)

    from gateway.connection_limits import raise_fd_limit
    from rose_triton.server import TritonServer
    from testing.gateway_process import GatewayProcess

    fd_limit = raise_fd_limit()  # this process holds both ends' client sockets
    desc = machine.describe()
    work = Path(tempfile.mkdtemp(prefix="perf-stalled-"))
    server = TritonServer(work / "server.log", ready_timeout=600)
    gateway = GatewayProcess(work / "gateway.log", [server.grpc_url],
                             ["--header-timeout", "600", "--body-timeout", "600", "--keep-alive-timeout", "600"])
    port, pid = gateway.port, gateway.process.pid
    held: list = []
    phases: dict[str, list[float]] = {}
    try:
        busy = machine.cpu_busy(2.0)
        for round_ in range(1, args.rounds + 1):  # interleaved: the machine's own load drifts alike for both
            phases[f"idle, round {round_}"] = good_latencies(port, args.requests)
            if round_ == 1:  # later rounds reuse what the first one's connections freed
                rss_idle = rss_mib(pid)
            held += [stall(port, i) for i in range(args.stalled)]
            held += [idle(port) for _ in range(args.idle)]
            wait_for(lambda: metric(port, "gateway_receiving_connections") == args.stalled, "the stalled uploads")
            state = {name: metric(port, name) for name in ("gateway_receiving_connections",
                                                           "gateway_open_connections")}
            if round_ == 1:
                rss_loaded = rss_mib(pid)
            phases[f"loaded, round {round_}"] = good_latencies(port, args.requests)
            for connection in held:
                connection.close()
            held.clear()
            wait_for(lambda: metric(port, "gateway_open_connections") <= 1, "the connections to close")
        busy_after = machine.cpu_busy(2.0)
        gateway_fd_limit = int(Path(f"/proc/{pid}/limits").read_text().split("Max open files")[1].split()[0])
    finally:
        for connection in held:
            connection.close()
        gateway.stop()
        server.stop()
    idle_all = [x for name, values in phases.items() if name.startswith("idle") for x in values]
    loaded_all = [x for name, values in phases.items() if name.startswith("loaded") for x in values]
    stats = {name: latency_stats(values) for name, values in phases.items()}
    stats["idle, all rounds"], stats["loaded, all rounds"] = latency_stats(idle_all), latency_stats(loaded_all)
    idle_stats, loaded_stats = stats["idle, all rounds"], stats["loaded, all rounds"]
    report = {"machine": desc, "busy_before": busy, "busy_after": busy_after, "fd_limit": fd_limit,
              "gateway_fd_limit": gateway_fd_limit, "stalled": args.stalled, "idle": args.idle,
              "gateway_state": state, "rss_mib": {"idle": rss_idle, "loaded": rss_loaded}, "phases": stats,
              "ratio": {"p50": loaded_stats["p50_ms"] / idle_stats["p50_ms"],
                        "p99": loaded_stats["p99_ms"] / idle_stats["p99_ms"]},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out_dir = Path(args.out) if args.out else REPO / "perf" / "results" / machine.slug(desc)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "stalled-uploads.json").write_text(json.dumps(report, indent=1))
    (out_dir / "stalled-uploads.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    m, state, rss = report["machine"], report["gateway_state"], report["rss_mib"]
    rows = ["| phase | requests | p50 ms | p90 ms | p99 ms | max ms |", "| --- | --- | --- | --- | --- | --- |"]
    for name, r in report["phases"].items():
        rows.append(f"| {name} | {r['n']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
                    f"{r['max_ms']:.2f} |")
    connections = report["stalled"] + report["idle"]
    return "\n".join([
        f"# Stalled uploads ({report['date']}, {m['cpu']}, {m['cores']} cores, commit {m['git_commit']})", "",
        f"Good requests: sequential batch-1 `/v1/embeddings` of one short text (all-MiniLM-L6-v2 on CPU), "
        f"kept-alive. Loaded: {report['stalled']} stalled uploads (headers and 20 of 1,000 body bytes, from "
        f"{ADDRESSES} loopback addresses) and {report['idle']} idle kept-alive connections; the gateway reported "
        f"{state['gateway_receiving_connections']:.0f} receiving and {state['gateway_open_connections']:.0f} open "
        f"connections (the /metrics one included). Gateway: default bounds, header/body/keep-alive timeouts 600 s. "
        f"Open files: `ulimit -n` {report['fd_limit']} here, the gateway's limit {report['gateway_fd_limit']}. "
        f"Machine busy (all cores, anyone's work): {report['busy_before']:.0%} before, "
        f"{report['busy_after']:.0%} after. Command: `python -m perf.stalled_uploads`.", "", *rows, "",
        f"Loaded vs idle (all rounds pooled): p50 {report['ratio']['p50']:.2f}x, "
        f"p99 {report['ratio']['p99']:.2f}x (target: p99 within 2x).", "",
        f"Gateway RSS: {rss['idle']:.0f} MiB idle, {rss['loaded']:.0f} MiB with the {connections} connections "
        f"(~{(rss['loaded'] - rss['idle']) * 1024 / connections:.1f} KiB each; first round).", ""])


if __name__ == "__main__":
    main()

"""Kill a tritonserver whose Python model stub has died (stdlib only).

Triton 2.51 neither restarts a dead Python-backend stub nor marks the server
or model unready: every new request fails with "Stub process '<model>' is not
healthy" and requests in flight in a decoupled model hang. serve.sh runs this
next to the server; every `--interval` s it sends one tiny real request, and
when the answer names an unhealthy stub it stops the server (SIGTERM, then
SIGKILL) and exits with RESTART, which tells serve.sh to start a fresh server.
Overload, timeouts and other errors are not stub deaths and are ignored.
While a test holds the encoder (ROSE_TEST_HOLD_FILE exists, docs/operations.md) it
does not probe: a held probe would wait and add to the queue the test counts.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

RESTART = 3
DEAD_STUB = "is not healthy"


PROBES = {"ensemble": {"TEXT": ["watchdog probe"]},
          "rerank": {"QUERY": ["watchdog probe"], "DOCUMENTS": ["watchdog probe"]}}


def probe(url: str, timeout: float, model: str = "ensemble") -> str:
    """'' when healthy or unknown; the error text when it names a dead stub."""
    body = json.dumps(PROBES[model]).encode()
    request = urllib.request.Request(f"{url}/v2/models/{model}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return ""
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        return text if DEAD_STUB in text else ""
    except OSError:  # not listening yet, busy, or timed out: not a stub death
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sleep_while_alive(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pid)


def stop(pid: int, grace: float) -> None:
    os.kill(pid, signal.SIGTERM)
    if sleep_while_alive(pid, grace):  # in-flight requests of the dead stub never finish
        os.kill(pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="tritonserver process id")
    parser.add_argument("--url", required=True, help="HTTP base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="per probe")
    parser.add_argument("--grace", type=float, default=2.0, help="SIGTERM to SIGKILL")
    parser.add_argument("--probe-rerank", action="store_true", help="also probe the `rerank` ensemble")
    args = parser.parse_args()
    models = ["ensemble"] + (["rerank"] if args.probe_rerank else [])
    hold_file = os.environ.get("ROSE_TEST_HOLD_FILE", "")
    while sleep_while_alive(args.pid, args.interval):
        if hold_file and os.path.exists(hold_file):
            continue
        error = next((e for e in (probe(args.url, args.timeout, m) for m in models) if e), "")
        if error and alive(args.pid):
            print(f"[watchdog] {time.strftime('%H:%M:%S')} {error.strip()}; stopping tritonserver {args.pid}",
                  file=sys.stderr, flush=True)
            stop(args.pid, args.grace)
            return RESTART
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing loops and statistics; stdlib + numpy only (peer venvs import it too)."""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Sequence

import numpy as np


def log(message: str) -> None:
    print(f"[perf] {message}", file=sys.stderr, flush=True)


def min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    """The lowest cosine between matching rows (every response is checked before it is timed)."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape}, expected {want.shape}")
    num = (got * want).sum(1)
    return float((num / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))).min())


def latency_stats(latencies_ms: Sequence[float]) -> dict:
    a = np.asarray(latencies_ms, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "mean_ms": float(a.mean())}


class Progress:
    """A status line on stderr every few seconds (every 0.2 s, overwritten, on a terminal)."""

    def __init__(self, label: str, total: float, unit: str = "req"):
        self.label, self.total, self.unit = label, total, unit
        self.start, self.tty, self._last = time.monotonic(), sys.stderr.isatty(), 0.0

    def update(self, done: float, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= (0.2 if self.tty else 5.0):
            self._last = now
            line = f"[perf] {self.label}: {done:.0f}/{self.total:.0f} {self.unit}  {now - self.start:5.1f}s"
            sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")

    def close(self) -> None:
        self.update(self.total, force=True)
        sys.stderr.write("\n" if self.tty else "")


def latency_loop(call: Callable, requests: Sequence, num_requests: int, max_seconds: float,
                 label: str = "latency") -> list[float]:
    """Strictly sequential: one request at a time, cycling through `requests`."""
    progress, latencies = Progress(label, num_requests), []
    deadline = time.monotonic() + max_seconds
    for i in range(num_requests):
        start = time.perf_counter()
        call(requests[i % len(requests)])
        latencies.append((time.perf_counter() - start) * 1e3)
        progress.update(i + 1)
        if time.monotonic() > deadline:
            break
    progress.close()
    return latencies


def closed_loop(call: Callable, requests: Sequence, start_at: float, duration: float, offset: int = 0) -> dict:
    """One client: send back-to-back from `start_at` (time.time) for `duration` s.

    The request in flight at the deadline is finished and counted; `combine`
    divides by the span from the earliest start to the last completion.
    """
    while time.time() < start_at:
        time.sleep(0.001)
    start_at = time.time()
    rows, latencies, i = 0, [], offset
    while time.time() < start_at + duration:
        request = requests[i % len(requests)]
        t0 = time.perf_counter()
        call(request)
        latencies.append((time.perf_counter() - t0) * 1e3)
        rows += len(request.seq_lens)
        i += 1
    return {"rows": rows, "requests": len(latencies), "start": start_at, "end": time.time(),
            "latencies_ms": latencies}


def combine(parts: list[dict]) -> dict:
    """Aggregate per-client closed-loop results into throughput + latency stats."""
    span = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    rows = sum(p["rows"] for p in parts)
    latencies = [x for p in parts for x in p["latencies_ms"]]
    return {"embeddings_per_s": rows / span, "requests_per_s": sum(p["requests"] for p in parts) / span,
            "seconds": span, "embeddings": rows, **latency_stats(latencies)}


def threaded_loop(call: Callable, requests: Sequence, concurrency: int, duration: float,
                  label: str = "throughput") -> dict:
    """`concurrency` threads in this process, each a closed loop (in-process peers)."""
    start_at = time.time() + 0.2
    parts: list = [None] * concurrency
    errors: list[BaseException] = []

    def client(k):
        try:
            parts[k] = closed_loop(call, requests, start_at, duration, offset=k * 7)
        except Exception as exc:  # raised below, once every client has stopped
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    progress = Progress(label, duration, "s")
    while any(t.is_alive() for t in threads):
        progress.update(max(0.0, time.time() - start_at))
        time.sleep(0.2)
    progress.close()
    if errors:
        raise errors[0]
    return combine(parts)

"""Endpoint metrics: what the service records, and a thread that exports it.

The service only records into `EncoderMetrics` (plain Python, cheap, no
Triton). A `MetricsPublisher` thread copies the records into a sink every
`interval` seconds, so the metric calls of Triton's Python backend (one IPC
round trip each) never sit on the scheduling or completion path.
"""
from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Union

from engine_lib.options import PRIORITIES

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "counter", "gauge" or "histogram"
    description: str
    buckets: tuple[float, ...] = ()


TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
WAIT_BUCKETS = SECONDS_BUCKETS + (30.0, 60.0)  # a batch-class request can wait behind a long backfill

SPECS = {spec.name: spec for spec in (
    MetricSpec("rose_queue_requests", "gauge", "Requests accepted by the encoder and not yet answered"),
    MetricSpec("rose_queue_tokens", "gauge", "Tokens queued in the encoder and not yet launched"),
    MetricSpec("rose_queue_sequences", "gauge", "Sequences queued in the encoder and not yet launched, by priority"),
    MetricSpec("rose_wait_seconds", "histogram",
               "Answered requests: seconds from arrival to the first sequence picked into a batch, by priority",
               WAIT_BUCKETS),
    MetricSpec("rose_priority_tokens_total", "counter", "Tokens launched in engine steps, by priority"),
    MetricSpec("rose_promoted_sequences_total", "counter",
               "Batch-priority sequences that left ahead of interactive work because the batch class was "
               "passed over longer than batch_promote_ms"),
    MetricSpec("rose_self_check_cosine", "gauge",
               "Load-time self-check: minimum cosine of the served dtype vs float32 on the built-in probes "
               "(labels: the device and dtype served)"),
    MetricSpec("rose_batch_token_budget", "gauge", "Token budget per engine step (max_batch_tokens, or measured)"),
    MetricSpec("rose_step_tokens", "histogram", "Tokens per engine step", TOKEN_BUCKETS),
    MetricSpec("rose_step_sequences", "histogram", "Sequences per engine step", SEQUENCE_BUCKETS),
    MetricSpec("rose_step_seconds", "histogram", "ModelRunner step latency, launch to result on the host",
               SECONDS_BUCKETS),
    MetricSpec("rose_requests_total", "counter", "Endpoint requests answered, by outcome"),
    MetricSpec("rose_refused_total", "counter", "Requests refused by admission control, by reason"),
    MetricSpec("rose_cancelled_sequences_total", "counter",
               "Queued sequences dropped before compute because their request was cancelled"),
    MetricSpec("rose_hop_seconds_total", "counter",
               "Seconds answered requests spent per hop inside the encoder (divide by rose_requests_total ok)"),
)}

# Hops of a request inside the encoder, in order (docs/operations.md).
HOPS = ("wait", "form", "compute", "respond")


# Label sets created at zero on start, so every series is on /metrics before it first moves.
INITIAL_LABELS = {
    "rose_requests_total": [{"outcome": o} for o in ("ok", "invalid", "error", "cancelled")],
    "rose_refused_total": [{"reason": r} for r in ("queue_tokens", "queue_requests", "shutting_down")],
    "rose_cancelled_sequences_total": [{}],
    "rose_hop_seconds_total": [{"hop": h} for h in HOPS],
    "rose_step_tokens": [{}], "rose_step_sequences": [{}], "rose_step_seconds": [{}],
    "rose_wait_seconds": [{"priority": p} for p in PRIORITIES],
    "rose_priority_tokens_total": [{"priority": p} for p in PRIORITIES],
    "rose_promoted_sequences_total": [{}],
}

# A gauge reading: a metric name, or (name, labels) for one labelled series.
GaugeKey = Union[str, tuple[str, Labels]]


class MetricSink(Protocol):
    def increment(self, name: str, labels: Labels, amount: float) -> None: ...

    def set(self, name: str, labels: Labels, value: float) -> None: ...

    def observe(self, name: str, labels: Labels, value: float) -> None: ...


class EncoderMetrics:
    """Counter increments and histogram observations waiting to be exported."""

    def __init__(self, max_pending_observations: int = 100_000):
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        # Bounded: if nobody exports, the oldest observations are lost, not memory.
        self._observations: collections.deque = collections.deque(maxlen=max_pending_observations)
        self.totals: collections.Counter = collections.Counter()  # never drained; for tests and logs

    def count(self, name: str, amount: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counts[key] += amount
            self.totals[key] += amount

    def count_each(self, name: str, label: str, amounts: Mapping[str, float]) -> None:
        """Several series of one counter under one lock: `name{label=key} += amount`."""
        with self._lock:
            for key, amount in amounts.items():
                series = (name, ((label, key),))
                self._counts[series] += amount
                self.totals[series] += amount

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._observations.append((name, tuple(sorted(labels.items())), value))

    def total(self, name: str, **labels: str) -> float:
        with self._lock:
            return self.totals[(name, tuple(sorted(labels.items())))]

    def drain(self) -> tuple[dict, list]:
        with self._lock:
            counts, self._counts = dict(self._counts), collections.Counter()
        observations = []
        while self._observations:
            observations.append(self._observations.popleft())
        return counts, observations


class MetricsPublisher:
    """Every `interval` s: gauges from `read_gauges()`, then drained counts and observations."""

    def __init__(self, metrics: EncoderMetrics, read_gauges: Callable[[], Mapping[GaugeKey, float]],
                 sink: MetricSink, interval: float = 0.5):
        self._metrics, self._read_gauges, self._sink = metrics, read_gauges, sink
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rose-metrics", daemon=True)
        self._thread.start()

    def publish(self) -> None:
        for key, value in self._read_gauges().items():
            name, labels = (key, ()) if isinstance(key, str) else key
            self._sink.set(name, labels, value)
        counts, observations = self._metrics.drain()
        for (name, labels), amount in counts.items():
            self._sink.increment(name, labels, amount)
        for name, labels, value in observations:
            self._sink.observe(name, labels, value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5 * self._interval + 1)

    def _run(self) -> None:
        while True:
            try:
                self.publish()
            except Exception:  # a broken sink must not kill the encoder; keep trying
                log.exception("publishing metrics failed")
            if self._stop.wait(self._interval):
                break
        self.publish()

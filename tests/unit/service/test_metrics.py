"""Endpoint metrics: recording, publishing through a sink, the Triton sink's calls."""
from __future__ import annotations

import gc
import time
import types
import weakref

from engine_lib.service.metrics import INITIAL_LABELS, SPECS, EncoderMetrics, MetricsPublisher
from rose_triton.metrics import TritonMetricSink


class RecordingSink:
    def __init__(self):
        self.calls = []

    def increment(self, name, labels, amount):
        self.calls.append(("increment", name, labels, amount))

    def set(self, name, labels, value):
        self.calls.append(("set", name, labels, value))

    def observe(self, name, labels, value):
        self.calls.append(("observe", name, labels, value))


def test_publish_drains_counts_and_observations_once():
    metrics, sink = EncoderMetrics(), RecordingSink()
    metrics.count("rose_refused_total", reason="queue_tokens")
    metrics.count("rose_refused_total", reason="queue_tokens")
    metrics.observe("rose_step_tokens", 128)
    publisher = MetricsPublisher(metrics, lambda: {"rose_queue_tokens": 7}, sink, interval=60)
    publisher.publish()
    assert ("increment", "rose_refused_total", (("reason", "queue_tokens"),), 2) in sink.calls
    assert ("observe", "rose_step_tokens", (), 128) in sink.calls
    assert ("set", "rose_queue_tokens", (), 7) in sink.calls
    sink.calls.clear()
    publisher.publish()
    assert [c[0] for c in sink.calls] == ["set"]  # nothing recorded since: only gauges again
    publisher.close()
    assert metrics.total("rose_refused_total", reason="queue_tokens") == 2


def test_labelled_gauges_are_published_with_their_labels():
    sink = RecordingSink()
    series = ("rose_queue_sequences", (("priority", "batch"),))
    publisher = MetricsPublisher(EncoderMetrics(), lambda: {series: 3, "rose_queue_tokens": 5}, sink, interval=60)
    publisher.publish()
    publisher.close()
    assert ("set", "rose_queue_sequences", (("priority", "batch"),), 3) in sink.calls
    assert ("set", "rose_queue_tokens", (), 5) in sink.calls


def test_unexported_observations_stay_bounded():
    metrics = EncoderMetrics(max_pending_observations=10)
    for i in range(1000):
        metrics.observe("rose_step_seconds", i)
    _, observations = metrics.drain()
    assert [v for _, _, v in observations] == list(range(990, 1000))


def test_a_failing_sink_does_not_stop_publishing():
    metrics = EncoderMetrics()

    class FlakySink(RecordingSink):
        failures = 1

        def set(self, name, labels, value):
            if self.failures:
                self.failures -= 1
                raise OSError("metrics IPC failed")
            super().set(name, labels, value)

    sink = FlakySink()
    publisher = MetricsPublisher(metrics, lambda: {"rose_queue_requests": 1}, sink, interval=0.01)
    deadline = time.monotonic() + 60
    while not sink.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    publisher.close()
    assert sink.calls


def fake_pb_utils():
    created = []

    class Metric:
        def __init__(self, family, labels, buckets=None):
            self.family, self.labels, self.buckets, self.ops = family, labels, buckets, []
            created.append(self)

        def increment(self, v):
            self.ops.append(("increment", v))

        def set(self, v):
            self.ops.append(("set", v))

        def observe(self, v):
            self.ops.append(("observe", v))

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "c", "g", "h"

        def __init__(self, name, description, kind):
            self.name, self.kind = name, kind

        def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils' spelling)
            return Metric(self, labels, buckets)

    return types.SimpleNamespace(MetricFamily=MetricFamily), created


def test_triton_sink_makes_one_metric_per_label_set():
    pb_utils, created = fake_pb_utils()
    sink = TritonMetricSink(pb_utils, {"model": "rose_encoder"})
    initial = len(created)
    assert initial == sum(len(v) for v in INITIAL_LABELS.values())
    sink.increment("rose_refused_total", (("reason", "queue_tokens"),), 1)
    sink.increment("rose_refused_total", (("reason", "queue_tokens"),), 2)
    sink.increment("rose_refused_total", (("reason", "unheard_of"),), 1)
    sink.observe("rose_step_seconds", (), 0.01)
    assert len(created) == initial + 1  # only the new label set made a metric
    by_labels = {(m.family.name, tuple(sorted(m.labels.items()))): m for m in created}
    refused = by_labels[("rose_refused_total", (("model", "rose_encoder"), ("reason", "queue_tokens")))]
    assert refused.ops == [("increment", 1), ("increment", 2)]
    histogram = by_labels[("rose_step_seconds", (("model", "rose_encoder"),))]
    assert histogram.family.kind == "h" and histogram.ops == [("observe", 0.01)]
    assert histogram.buckets == list(SPECS["rose_step_seconds"].buckets)


def test_triton_sink_close_releases_every_metric_and_family_and_ignores_later_calls():
    pb_utils, created = fake_pb_utils()
    sink = TritonMetricSink(pb_utils, {"model": "rose_encoder"})
    sink.observe("rose_step_seconds", (), 0.01)
    alive = [weakref.ref(m) for m in created] + list({id(m.family): weakref.ref(m.family) for m in created}.values())
    count = len(created)
    created.clear()
    gc.disable()  # released by reference counts alone, as in the stub's `finalize`
    try:
        sink.close()
        assert [r for r in alive if r() is not None] == []
    finally:
        gc.enable()
    sink.increment("rose_refused_total", (("reason", "queue_tokens"),), 1)
    sink.set("rose_queue_tokens", (), 3)
    sink.observe("rose_step_seconds", (), 0.01)
    assert count > 0 and created == []  # nothing made after close

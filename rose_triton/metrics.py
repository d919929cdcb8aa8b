"""EncoderMetrics exported through the Python backend's `pb_utils.MetricFamily`."""
from __future__ import annotations

from typing import Mapping

from engine_lib.service.metrics import INITIAL_LABELS, SPECS, Labels


class TritonMetricSink:
    """A MetricSink over the Python backend's `pb_utils.MetricFamily` (passed in, not imported).

    `close()` must run in the model's `finalize`: in Triton 2.51 a Metric or MetricFamily still
    alive when the stub tears down is deleted from `Stub::~Stub`, whose delete message then
    reads the stub's shared-memory pool through a null pointer: SIGSEGV ("segfault at 60 ...
    in triton_python_backend_stub", `Metric::SaveToSharedMemory`; fixed upstream in
    python_backend#429, after 2.51). Deleted while the stub lives, they are unregistered cleanly.
    """

    def __init__(self, pb_utils, base_labels: Mapping[str, str]):
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        self._base_labels = dict(base_labels)
        self._families = {name: pb_utils.MetricFamily(name=name, description=spec.description,
                                                       kind=kinds[spec.kind])
                          for name, spec in SPECS.items()}
        self._metrics: dict[tuple[str, Labels], object] = {}
        self._closed = False
        for name, label_sets in INITIAL_LABELS.items():
            for labels in label_sets:
                self._metric(name, tuple(sorted(labels.items())))

    def close(self) -> None:
        """Delete every Metric, then every MetricFamily (the backend's order); later calls do nothing."""
        self._closed = True
        self._metrics.clear()
        self._families.clear()

    def _metric(self, name: str, labels: Labels):
        key = (name, labels)
        if key not in self._metrics:
            spec = SPECS[name]
            all_labels = {**self._base_labels, **dict(labels)}
            if spec.kind == "histogram":
                self._metrics[key] = self._families[name].Metric(labels=all_labels, buckets=list(spec.buckets))
            else:
                self._metrics[key] = self._families[name].Metric(labels=all_labels)
        return self._metrics[key]

    def increment(self, name: str, labels: Labels, amount: float) -> None:
        if not self._closed:
            self._metric(name, labels).increment(amount)

    def set(self, name: str, labels: Labels, value: float) -> None:
        if not self._closed:
            self._metric(name, labels).set(value)

    def observe(self, name: str, labels: Labels, value: float) -> None:
        if not self._closed:
            self._metric(name, labels).observe(value)

"""EncoderMetrics exported through the Python backend's `pb_utils.MetricFamily`."""
from __future__ import annotations

from typing import Mapping

from engine_lib.service.metrics import INITIAL_LABELS, SPECS, Labels


class TritonMetricSink:
    """A MetricSink over the Python backend's `pb_utils.MetricFamily` (passed in, not imported)."""

    def __init__(self, pb_utils, base_labels: Mapping[str, str]):
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        self._base_labels = dict(base_labels)
        self._families = {name: pb_utils.MetricFamily(name=name, description=spec.description,
                                                       kind=kinds[spec.kind])
                          for name, spec in SPECS.items()}
        self._metrics: dict[tuple[str, Labels], object] = {}
        for name, label_sets in INITIAL_LABELS.items():
            for labels in label_sets:
                self._metric(name, tuple(sorted(labels.items())))

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
        self._metric(name, labels).increment(amount)

    def set(self, name: str, labels: Labels, value: float) -> None:
        self._metric(name, labels).set(value)

    def observe(self, name: str, labels: Labels, value: float) -> None:
        self._metric(name, labels).observe(value)

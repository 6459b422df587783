"""Ray's own metrics: the Prometheus series of :mod:`advmon.sinks.prometheus`, exported by Ray.

Under Ray every worker would need its own scrape port; Ray already runs a metrics
agent per node that serves what ``ray.util.metrics`` records in any worker and
writes a service-discovery file for Prometheus
(``/tmp/ray/prom_metrics_service_discovery.json``). This sink sets one Ray gauge
per advmon series. Ray adds a ``ray_`` prefix and its own labels (``SessionName``,
``NodeAddress``, ``WorkerId``, ...): the generated rules and boards accept both
``advmon_*`` and ``ray_advmon_*``. Counters are exported as gauges holding the
running total, which ``increase()`` reads the same way.

Needs ``ray[default]`` (the metrics agent). Spec: ``ray-metrics``.
"""

from __future__ import annotations

import math
from typing import Any

from advmon.record import Record
from advmon.sinks.base import Sink, require
from advmon.sinks.prometheus import AdvmonCollector

__all__ = ["RayMetricsSink"]


class RayMetricsSink(Sink):
    """Set ``ray.util.metrics`` gauges from each record (one per advmon series)."""

    name = "ray-metrics"

    def __init__(self, run: str = "") -> None:
        require("prometheus_client", "prometheus")
        self._metrics = require("ray.util.metrics", "ray")
        self.collector = AdvmonCollector(run)
        self._gauges: dict[str, Any] = {}

    def attach(self, run: str, sink_names: Any) -> None:
        """Called by the monitor: the run label and the sinks whose counters start at 0."""
        self.collector.run = run
        self.collector.set_sink_names(sink_names)

    def write(self, record: Record) -> None:
        self.collector.update(record)
        for family in self.collector.collect():
            for sample in family.samples:
                if math.isnan(sample.value):
                    continue  # no value is no sample, as in the scrape endpoint's text
                self._gauge(sample.name, family.documentation, tuple(sample.labels)).set(
                    float(sample.value), tags=dict(sample.labels))

    def _gauge(self, name: str, description: str, labels: tuple[str, ...]) -> Any:
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = self._metrics.Gauge(name, description=description, tag_keys=labels)
        return gauge

    def __repr__(self) -> str:
        return "RayMetricsSink()"

"""The Prometheus text of one scrape, written by ``prometheus_client.generate_latest``.

One difference from Triton had to be undone: ``prometheus_client`` (>= 0.4, OpenMetrics naming) names a
counter family ``<name>_total`` in its ``# HELP``/``# TYPE`` lines, while Triton (prometheus-cpp) writes
``# TYPE nv_inference_request_success counter`` and samples without ``_total`` -- the names dashboards and
Triton's own custom-metrics example look for. Our counter samples keep their bare names; only those two
header lines are renamed back here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Collected:
    """Runs the collector once per scrape and remembers which counter families it produced."""

    def __init__(self, collector: object) -> None:
        self.collector = collector
        self.counters: list[str] = []

    def collect(self):  # prometheus_client's collector protocol
        self.counters = []
        for metric in self.collector.collect():  # type: ignore[attr-defined]
            if metric.type == "counter":
                self.counters.append(metric.name)
            yield metric


def render(collector: object) -> bytes:
    """Scrape ``collector`` (a ``prometheus_client`` collector) into Triton-shaped Prometheus text."""
    collected = _Collected(collector)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collected)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    for name in collected.counters:
        text = text.replace(f"# HELP {name}_total ", f"# HELP {name} ", 1)
        text = text.replace(f"# TYPE {name}_total counter\n", f"# TYPE {name} counter\n", 1)
    return text.encode()

"""One worker's metrics as plain, JSON-able data: the answer to ``host.gather("metrics")``.

Runs in the greenlet the host gives the handler (on the hub): it asks each READY version's scheduler for
its :class:`~triton_actor.metrics.statistics.VersionStats` snapshot (one mailbox round trip per version, nothing
on the hot path) and reads the custom metric families of this server's models (the ``pb_utils``
:class:`~..backends.python.triton_python_backend_utils.serving.MetricRegistry` the server hands it). Owner of nothing: the counters
stay with the schedulers, the custom series with the models that update them (on their instance
threads; a float read under the GIL is whole, so a scrape sees a value before or after an update).
Failure: a version that does not answer (stopped meanwhile) is left out of this scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..actors.model.handles import READY
from ..backends.python.metrics_mirror import flush_isolated
from ..backends.python.triton_python_backend_utils.serving import MetricRegistry
from ..errors import TritonError

log = logging.getLogger(__name__)

# the duration counters: family suffix → the VersionStats duration it sums (microseconds)
DURATIONS = {
    "request": "success",
    "queue": "queue",
    "compute_input": "compute_input",
    "compute_infer": "compute_infer",
    "compute_output": "compute_output",
}


def version_entry(stats: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's statistics snapshot → the fields the metric families need."""
    d = stats["durations"]
    return {
        "model": stats["name"],
        "version": str(stats["version"]),
        "success": d["success"][0],
        "failures": dict(stats.get("failures", {})),
        "inference_count": stats["inference_count"],
        "exec_count": stats["execution_count"],
        "pending": stats.get("pending", 0),
        "durations_us": {k: d[src][1] // 1000 for k, src in DURATIONS.items()},
        "load_secs": stats.get("load_secs", 0.0),
        **({"cache": {k: (d[k][0], d[k][1] // 1000) for k in ("cache_hit", "cache_miss")}}
           if stats.get("cache_enabled") else {}),
        **({"latency": stats["latency_windows"]} if "latency_windows" in stats else {}),
    }


def _series(metric: Any) -> dict[str, Any]:
    if metric._buckets is None:
        return {"labels": dict(metric._labels), "value": metric._value}
    return {"labels": dict(metric._labels), "buckets": list(metric._buckets), "counts": list(metric._bucket_counts),
            "sum": metric._sum, "count": metric._count}


def custom_families(registry: MetricRegistry) -> list[dict[str, Any]]:
    """Every ``pb_utils.MetricFamily`` the models of ``registry``'s server created, with its series' values."""
    kinds = {0: "counter", 1: "gauge", 2: "histogram"}
    return [
        {"name": f._name, "description": f._description, "kind": kinds[f._kind],
         "series": [_series(m) for m in list(f._metrics.values())]}
        for f in list(registry.families)
    ]


class MetricsSource:
    """This process's ``metrics`` host handler (registered by the server)."""

    def __init__(self, repository: Any, registry: MetricRegistry, cache: Any = None,
                 own: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.repository = repository
        self.registry = registry  # the server's custom metric families (its Python models')
        self.cache = cache  # the server's response cache store (cache/), None without --cache-config
        self.own = own  # the server's own families in the same shape (plane/memory_budget.py: loads on demand, budget)

    def __call__(self, _args: dict[str, Any]) -> dict[str, Any]:
        models = []
        for _, handle in sorted(self.repository.routes.items()):
            for v in handle.ready_versions:
                vh = handle.versions[v]
                if vh.state != READY:
                    continue
                try:
                    models.append(version_entry(vh.statistics()))
                except TritonError as e:  # unloaded between the table read and the ask
                    log.debug("metrics: %s version %d left out: %s", handle.name, v, e)
        flush_isolated(self.registry)  # isolated Python models' custom metrics, current (nothing to do without one)
        out = {"models": models, "custom": custom_families(self.registry) + (self.own() if self.own else [])}
        if self.cache is not None:
            out["cache"] = self.cache.metrics()
        return out

"""Worker snapshots → Triton's metric families (``prometheus_client`` objects), summed over workers.

Pure functions plus one ``prometheus_client`` collector; runs in the scrape's greenlet. Names, types,
labels and help texts are Triton's (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md, core ``metric_model_reporter.cc``): counters carry no
``_total`` suffix there, so our counter families keep their bare names (see :mod:`.exposition`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from prometheus_client.core import Metric

from .config import MetricsConfig
from .latency import STAGES as _STAGE_NAMES
from .statistics import FAILURE_REASONS

_COUNTERS = (  # family, help, snapshot field
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", "inference_count"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     "exec_count"),
)
_DURATIONS = (  # family, help, durations_us key
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds "
     "(includes cached requests)", "request"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds "
     "(includes cached requests)", "queue"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds "
     "(does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds "
     "(does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds "
     "(does not include cached requests)", "compute_output"),
)
_CACHE = (  # family, help, (snapshot "cache" key, 0 = count / 1 = microseconds); Triton core metrics.cc
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", ("cache_hit", 0)),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", ("cache_hit", 1)),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", ("cache_miss", 0)),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     ("cache_miss", 1)),
)
# the server-wide gauges Triton 2.51 exports with a cache on (core metrics.cc): family → help, value of the
# summed store snapshots (cache/counters.py)
CACHE_GAUGES: dict[str, tuple[str, Callable[[dict[str, int]], float]]] = {
    "nv_cache_util": ("Cache utilization [0.0 - 1.0]", lambda c: c["used"] / c["size"] if c["size"] else 0.0),
    "nv_cache_num_entries": ("Number of responses stored in response cache", lambda c: c["entries"]),
    "nv_cache_num_hits": ("Number of cache hits in response cache", lambda c: c["hits"]),
    "nv_cache_num_misses": ("Number of cache misses in response cache", lambda c: c["misses"]),
    "nv_cache_num_lookups": ("Number of cache lookups in response cache", lambda c: c["lookups"]),
    "nv_cache_num_evictions": ("Number of cache evictions in response cache", lambda c: c["evictions"]),
    "nv_cache_lookup_duration": ("Total cache lookup duration (hit and miss), in microseconds",
                                 lambda c: c["lookup_us"]),
    "nv_cache_insertion_duration": ("Total cache insertion duration, in microseconds", lambda c: c["insertion_us"]),
}
SYSTEM = {  # family → (type, help)
    "nv_cpu_utilization": ("gauge", "CPU utilization rate [0.0 - 1.0]"),
    "nv_cpu_memory_total_bytes": ("gauge", "CPU total memory (RAM), in bytes"),
    "nv_cpu_memory_used_bytes": ("gauge", "CPU used memory (RAM), in bytes"),
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumption in joules since the Triton Server started"),
}


def merge_models(snapshots: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum every worker's per-version entries (same model and version = one series); load time: the longest."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for snap in snapshots:
        for e in snap.get("models", []):
            key = (e["model"], e["version"])
            m = merged.get(key)
            if m is None:
                merged[key] = {**e, "failures": dict(e["failures"]), "durations_us": dict(e["durations_us"])}
                continue
            for f in ("success", "inference_count", "exec_count", "pending"):
                m[f] += e[f]
            for r, n in e["failures"].items():
                m["failures"][r] = m["failures"].get(r, 0) + n
            for k, us in e["durations_us"].items():
                m["durations_us"][k] += us
            m["load_secs"] = max(m["load_secs"], e["load_secs"])
            if "cache" in e:
                have = m.get("cache", {"cache_hit": (0, 0), "cache_miss": (0, 0)})
                m["cache"] = {k: (have[k][0] + n, have[k][1] + us) for k, (n, us) in e["cache"].items()}
            if "latency" in e:
                m["latency"] = merge_latency(m.get("latency"), e["latency"])
    return [merged[k] for k in sorted(merged)]


def merge_latency(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two workers' :class:`~.latency.LatencyRecorder` snapshots of one version as one."""
    if a is None:
        return b
    out = {"count": a["count"] + b["count"], "sums": [x + y for x, y in zip(a["sums"], b["sums"], strict=True)]}
    if "samples" in a:
        out["samples"] = {k: a["samples"][k] + b["samples"][k] for k in a["samples"]}
    if "buckets" in a:
        out["buckets"] = [x + y for x, y in zip(a["buckets"], b["buckets"], strict=True)]
        out["bounds"] = a["bounds"]
    if "cache" in a or "cache" in b:
        ca, cb = a.get("cache", {}), b.get("cache", {})
        out["cache"] = {k: {"count": ca.get(k, {}).get("count", 0) + cb.get(k, {}).get("count", 0),
                            "sum": ca.get(k, {}).get("sum", 0) + cb.get(k, {}).get("sum", 0),
                            "samples": ca.get(k, {}).get("samples", []) + cb.get(k, {}).get("samples", [])}
                        for k in ("hit", "miss")}
    return out


def merge_custom(snapshots: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum the models' own series over workers (counters, gauges and histogram buckets alike); a family
    marked ``"merge": "max"`` (a setting every worker has, such as the model memory budget) takes the largest."""
    families: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        for fam in snap.get("custom", []):
            f = families.setdefault(fam["name"], {**fam, "series": {}})
            for s in fam["series"]:
                key = tuple(sorted(s["labels"].items()))
                have = f["series"].get(key)
                if have is None:
                    f["series"][key] = {**s, **({"counts": list(s["counts"])} if "counts" in s else {})}
                elif "counts" in s:
                    have["counts"] = [a + b for a, b in zip(have["counts"], s["counts"], strict=False)]
                    have["sum"] += s["sum"]
                    have["count"] += s["count"]
                elif fam.get("merge") == "max":
                    have["value"] = max(have["value"], s["value"])
                else:
                    have["value"] += s["value"]
    return [{**f, "series": list(f["series"].values())} for _, f in sorted(families.items())]


def _labels(e: dict[str, Any]) -> dict[str, str]:
    return {"model": e["model"], "version": e["version"]}


def model_families(models: list[dict[str, Any]], config: MetricsConfig) -> Iterator[Metric]:
    fail = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter")
    for e in models:
        for reason in FAILURE_REASONS:
            fail.add_sample(fail.name, {**_labels(e), "reason": reason}, e["failures"].get(reason, 0))
    counters = [(n, h, lambda e, f=f: e[f]) for n, h, f in _COUNTERS]
    yield from _per_model(models, counters[:1], "counter")
    yield fail
    yield from _per_model(models, counters[1:], "counter")
    yield from _per_model(models, [("nv_inference_pending_request_count", "Instantaneous number of pending requests "
                                    "awaiting execution per-model.", lambda e: e["pending"])], "gauge")
    if config.counter_latencies:
        yield from _per_model(models, [(n, h, lambda e, k=k: e["durations_us"][k]) for n, h, k in _DURATIONS],
                              "counter")
        cached = [e for e in models if "cache" in e]  # Triton makes these only for models whose cache is on
        if cached:
            yield from _per_model(cached, [(n, h, lambda e, k=k: e["cache"][k[0]][k[1]]) for n, h, k in _CACHE],
                                  "counter")
    if config.summary_latencies:
        yield from summary_families(models, config.summary_quantiles)
        yield from cache_summary_families(models, config.summary_quantiles)
    if config.histogram_latencies:
        yield from histogram_family(models)
    yield from _per_model(models, [("nv_model_load_duration_secs", "Model load time in seconds",
                                    lambda e: e["load_secs"])], "gauge")


_SUMMARIES = (  # family, help, LatencyRecorder stage index
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds "
     "(includes cached requests)", 0),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds "
     "(includes cached requests)", 1),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds "
     "(does not include cached requests)", 2),
    ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in microseconds "
     "(does not include cached requests)", 3),
    ("nv_inference_compute_output_summary_us", "Summary of inference compute output duration in microseconds "
     "(does not include cached requests)", 4),
)


def summary_families(models: list[dict[str, Any]], quantiles: tuple[tuple[float, float], ...]) -> Iterator[Metric]:
    """Quantiles over each version's recent window (all workers' samples together), count and sum since load."""
    for name, help_text, index in _SUMMARIES:
        m = Metric(name, help_text, "summary")
        for e in models:
            lat = e.get("latency")
            if lat is None or "samples" not in lat:
                continue
            _summary(m, _labels(e), lat["samples"][_STAGE_NAMES[index]], quantiles, lat["count"], lat["sums"][index])
        yield m


def _summary(m: Metric, labels: dict[str, str], samples: list[float], quantiles: tuple[tuple[float, float], ...],
             count: int, total: float) -> None:
    """One series of a summary: the quantiles over the recent ``samples``, the count and sum since load."""
    window = np.asarray(samples, dtype=np.float64)
    for q, _err in quantiles:
        v = float(np.quantile(window, q, method="inverted_cdf")) if window.size else float("nan")
        m.add_sample(m.name, {**labels, "quantile": repr(q)}, v)
    m.add_sample(m.name + "_count", labels, count)
    m.add_sample(m.name + "_sum", labels, total)


_CACHE_SUMMARIES = (  # family, help (Triton core metrics.cc), LatencyRecorder cache kind
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.", "hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.", "miss"),
)


def cache_summary_families(models: list[dict[str, Any]], quantiles: tuple[tuple[float, float], ...]) -> Iterator[Metric]:
    """The response cache's hit and miss durations, for versions whose cache is on (as Triton, with summaries on)."""
    cached = [e for e in models if "cache" in e.get("latency", {})]
    if not cached:
        return
    for name, help_text, kind in _CACHE_SUMMARIES:
        m = Metric(name, help_text, "summary")
        for e in cached:
            data = e["latency"]["cache"][kind]
            _summary(m, _labels(e), data["samples"], quantiles, data["count"], data["sum"])
        yield m


def histogram_family(models: list[dict[str, Any]]) -> Iterator[Metric]:
    name = "nv_inference_first_response_histogram_ms"
    m = Metric(name, "Duration from request to first response in milliseconds", "histogram")
    for e in models:
        lat = e.get("latency")
        if lat is None or "buckets" not in lat:
            continue
        cumulative = 0
        for bound, n in zip([*lat["bounds"], float("inf")], lat["buckets"], strict=True):
            cumulative += n
            m.add_sample(name + "_bucket", {**_labels(e), "le": _bound(bound)}, cumulative)
        m.add_sample(name + "_count", _labels(e), lat["count"])
        m.add_sample(name + "_sum", _labels(e), lat["sums"][0] / 1000)
    yield m


def _per_model(models: list[dict[str, Any]], specs: list[tuple[str, str, Callable[[dict[str, Any]], float]]],
               kind: str) -> Iterator[Metric]:
    for name, help_text, value in specs:
        m = Metric(name, help_text, kind)
        for e in models:
            m.add_sample(name, _labels(e), value(e))
        yield m


def custom_metric_families(families: list[dict[str, Any]]) -> Iterator[Metric]:
    for fam in families:
        name, kind = fam["name"], fam["kind"]
        m = Metric(name, fam["description"], kind)
        m.name = name  # Metric() strips a counter's "_total"; the model named it, keep the name as given
        for s in fam["series"]:
            if kind != "histogram":
                m.add_sample(name, s["labels"], s["value"])
                continue
            cumulative = 0
            for bound, n in zip([*s["buckets"], float("inf")], s["counts"], strict=True):
                cumulative += n
                m.add_sample(name + "_bucket", {**s["labels"], "le": _bound(bound)}, cumulative)
            m.add_sample(name + "_count", s["labels"], s["count"])
            m.add_sample(name + "_sum", s["labels"], s["sum"])
        yield m


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


def cache_families(snapshots: list[dict[str, Any]]) -> Iterator[Metric]:
    """Every worker's store counters summed (each worker has its own local cache, or its own Redis client)."""
    stores = [snap["cache"] for snap in snapshots if "cache" in snap]
    if not stores:
        return
    total = {k: sum(s[k] for s in stores) for k in stores[0]}
    for name, (help_text, value) in CACHE_GAUGES.items():
        m = Metric(name, help_text, "gauge")
        m.add_sample(name, {}, value(total))
        yield m


def system_families(values: dict[str, list[tuple[dict[str, str], float]]]) -> Iterator[Metric]:
    for name, (kind, help_text) in SYSTEM.items():
        if name in values:
            m = Metric(name, help_text, kind)
            for labels, v in values[name]:
                m.add_sample(name, labels, v)
            yield m


class TritonCollector:
    """A ``prometheus_client`` collector: every scrape gathers every worker's snapshot and builds the families."""

    def __init__(self, gather: Callable[[], list[dict[str, Any]]], config: MetricsConfig,
                 system: Callable[[], dict[str, list[tuple[dict[str, str], float]]]]) -> None:
        self.gather, self.config, self.system = gather, config, system

    def collect(self) -> Iterator[Metric]:
        snapshots = self.gather()
        yield from model_families(merge_models(snapshots), self.config)
        yield from cache_families(snapshots)
        yield from system_families(self.system())
        yield from custom_metric_families(merge_custom(snapshots))

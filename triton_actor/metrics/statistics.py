"""Cumulative per-version inference statistics, as Triton's statistics extension reports them (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_statistics.md).

Owned by the version's scheduler actor, which records into it from its own greenlet; readers get a
:meth:`VersionStats.snapshot` (plain data) through the scheduler's mailbox.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# nv_inference_request_failure's ``reason`` label (Triton core's FailureReason); every series exists from load
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# Request latency histogram (the status page's percentiles): fixed log-spaced buckets, four per octave of
# 256 ns units (a bucket's bounds are at most 25% apart) up to about 10 hours (longer lands in the last);
# the index comes from ``int.bit_length``: constant cost, no search, no allocation per request. Indexes
# 4-11 stay empty (the first octaves are the four 256 ns buckets 0-3).
LATENCY_BUCKETS = 152
_LAST_OCTAVE = LATENCY_BUCKETS // 4  # from this octave on, everything lands in the last bucket


def latency_bucket(ns: int) -> int:
    v = ns >> 8
    b = v.bit_length()
    if b < 3:
        return v
    return min(b * 4 + ((v >> (b - 3)) & 3), LATENCY_BUCKETS - 1)


def bucket_upper_ns(index: int) -> int:
    """The exclusive upper bound of bucket ``index`` in ns (what a percentile in that bucket reports)."""
    if index < 12:
        return (min(index, 3) + 1) << 8
    b, sub = divmod(index, 4)
    return ((5 + sub) << (b - 3)) << 8


def percentile_ns(buckets: list[int], q: float) -> int:
    """The upper bound of the bucket holding the ``q`` quantile (0 < q <= 1); 0 without data."""
    total = sum(buckets)
    if not total:
        return 0
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        seen += n
        if n and seen >= rank:
            return bucket_upper_ns(i)
    return bucket_upper_ns(len(buckets) - 1)


class VersionStats:
    """Counters of one model version. Counting rules mirror Triton core:

    ``inference_count`` counts batch elements, ``execution_count`` model executions,
    ``success``/``queue`` count requests, ``compute_*`` count requests that executed.
    """

    __slots__ = ("name", "version", "last_inference", "inference_count", "execution_count", "durations",
                 "batches", "failures", "load_secs", "latency", "latency_recorder", "cache_enabled", "_success", "_queue", "_input", "_infer", "_output")

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.last_inference = 0
        self.inference_count = 0
        self.execution_count = 0
        self.durations = {k: Duration() for k in _DURATIONS}
        self.batches: dict[int, BatchStat] = {}
        self.latency = [0] * LATENCY_BUCKETS  # successful requests by end-to-end time (latency_bucket)
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)  # failed requests by reason (metrics only)
        self.load_secs = 0.0  # how long the version took to load (nv_model_load_duration_secs)
        self.latency_recorder: Any = None  # a metrics.latency.LatencyRecorder when summaries/histograms are on
        self.cache_enabled = False  # answers go through the response cache: the nv_cache_* families exist
        d = self.durations  # the hot path adds to these directly (a method call each is measurable)
        self._success, self._queue = d["success"], d["queue"]
        self._input, self._infer, self._output = d["compute_input"], d["compute_infer"], d["compute_output"]

    def record_execution(self, batch_size: int, ci_ns: int, inf_ns: int, co_ns: int) -> None:
        """One model execution of ``batch_size`` elements (counted even when the model failed, as Triton does)."""
        self.execution_count += 1
        self.last_inference = time.time_ns() // 1_000_000
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStat()
        b.compute_input.count += 1
        b.compute_input.ns += ci_ns
        b.compute_infer.count += 1
        b.compute_infer.ns += inf_ns
        b.compute_output.count += 1
        b.compute_output.ns += co_ns

    def record_success(self, batch_size: int, total_ns: int, queue_ns: int, timings: tuple[int, int, int]) -> None:
        """A request answered: its elements count as inferences, its batch's compute times are its own."""
        self.inference_count += batch_size
        v = total_ns >> 8  # latency_bucket(total_ns), inlined: a call costs more than the arithmetic
        b = v.bit_length()
        self.latency[(b * 4 + ((v >> (b - 3)) & 3) if b < _LAST_OCTAVE else LATENCY_BUCKETS - 1) if b >= 3 else v] += 1
        # written out rather than looped over (duration, ns) pairs: the loop built six tuples per request and
        # ran 175 bytecodes, this about half of them
        d = self._success
        d.count += 1
        d.ns += total_ns
        d = self._queue
        d.count += 1
        d.ns += queue_ns
        ci_ns, inf_ns, co_ns = timings
        d = self._input
        d.count += 1
        d.ns += ci_ns
        d = self._infer
        d.count += 1
        d.ns += inf_ns
        d = self._output
        d.count += 1
        d.ns += co_ns
        if self.latency_recorder is not None:
            self.latency_recorder.observe(total_ns, queue_ns, timings)

    def record_cache_hit(self, total_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache (the cache front, on the hub thread): a success that
        queued for no time and ran nothing, so no inference or execution counts (Triton core's
        ``UpdateSuccessCacheHit``)."""
        for duration, ns in ((self._success, total_ns), (self._queue, 0), (self.durations["cache_hit"], lookup_ns)):
            duration.count += 1
            duration.ns += ns
        if self.latency_recorder is not None:
            self.latency_recorder.observe_cache("hit", lookup_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A request the cache did not hold, answered by its model: lookup plus insertion time, which
        Triton also adds to the request's duration (``UpdateSuccessCacheMiss``)."""
        self._success.ns += miss_ns
        self.durations["cache_miss"].add(miss_ns)
        if self.latency_recorder is not None:
            self.latency_recorder.observe_cache("miss", miss_ns)

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        """A request that reached the scheduler and failed (rejected-before-queueing ones are not counted);
        ``reason`` is one of :data:`FAILURE_REASONS`."""
        self.durations["fail"].add(total_ns)
        self.failures[reason] += 1

    def snapshot(self) -> dict[str, object]:
        """A plain-data copy for the protocol layer."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "durations": {k: (v.count, v.ns) for k, v in self.durations.items()},
            "failures": dict(self.failures),
            "load_secs": self.load_secs,
            "cache_enabled": self.cache_enabled,
            **({"latency_windows": self.latency_recorder.snapshot()} if self.latency_recorder is not None else {}),
            "batches": {
                size: (b.compute_input.count, b.compute_input.ns, b.compute_infer.ns, b.compute_output.ns)
                for size, b in sorted(self.batches.items())
            },
            "latency": list(self.latency),
        }

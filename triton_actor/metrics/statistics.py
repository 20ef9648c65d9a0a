"""Cumulative per-version inference statistics, as Triton's statistics extension reports them (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_statistics.md).

Owned by the version's scheduler actor, which records into it from its own greenlet; readers get a
:meth:`VersionStats.snapshot` (plain data) through the scheduler's mailbox.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime import fastpath

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
# successes kept as rows before they are added up (a fast path): appending a row is about 20 bytecodes where
# adding one up was 141, and a fold of 256 rows with numpy costs about 0.1 us a row; readers fold first
FOLD_ROWS = 256
_FOLD_MAX = 1 << 54  # values under it: FOLD_ROWS of them sum within int64 (a request of 208 days)


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

    __slots__ = ("name", "version", "last_inference", "_inferences", "_executions", "durations",
                 "batches", "failures", "load_secs", "latency", "latency_recorder", "cache_enabled", "_success",
                 "_queue", "_input", "_infer", "_output", "_rows", "_cache_hit")

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.last_inference = 0
        self._inferences = 0
        # successes not added up yet (fast path): batch size, total, queue, compute input/infer/output ns, and
        # whether the row is also its own execution (record_success's ``single``)
        self._rows: list[tuple[int, int, int, int, int, int, bool]] = []
        self._executions = 0
        self.durations = {k: Duration() for k in _DURATIONS}
        self.batches: dict[int, BatchStat] = {}
        self.latency = [0] * LATENCY_BUCKETS  # successful requests by end-to-end time (latency_bucket)
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)  # failed requests by reason (metrics only)
        self.load_secs = 0.0  # how long the version took to load (nv_model_load_duration_secs)
        self.latency_recorder: Any = None  # a metrics.latency.LatencyRecorder when summaries/histograms are on
        self.cache_enabled = False  # answers go through the response cache: the nv_cache_* families exist
        d = self.durations  # the hot path adds to these directly (a method call each is measurable)
        self._success, self._queue, self._cache_hit = d["success"], d["queue"], d["cache_hit"]
        self._input, self._infer, self._output = d["compute_input"], d["compute_infer"], d["compute_output"]

    def record_execution(self, batch_size: int, ci_ns: int, inf_ns: int, co_ns: int) -> None:
        """One model execution of ``batch_size`` elements (counted even when the model failed, as Triton does)."""
        self.last_inference = time.time_ns() // 1_000_000
        self._execution(batch_size, ci_ns, inf_ns, co_ns)

    def _execution(self, batch_size: int, ci_ns: int, inf_ns: int, co_ns: int) -> None:
        self._executions += 1
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStat()
        b.compute_input.count += 1
        b.compute_input.ns += ci_ns
        b.compute_infer.count += 1
        b.compute_infer.ns += inf_ns
        b.compute_output.count += 1
        b.compute_output.ns += co_ns

    @property
    def inference_count(self) -> int:
        self.fold()
        return self._inferences

    @property
    def execution_count(self) -> int:
        self.fold()
        return self._executions

    def record_success(self, batch_size: int, total_ns: int, queue_ns: int, timings: tuple[int, int, int],
                       single: bool = False) -> None:
        """A request answered: its elements count as inferences, its batch's compute times are its own.
        ``single``: it was its batch's only request, and its execution is counted here too (what
        :meth:`record_execution` counts: most batches without dynamic batching, every ensemble step on such a
        model; one row for both on the fast path)."""
        if fastpath.enabled:  # kept as a row, added up by the next reader or every FOLD_ROWS rows
            if single:
                self.last_inference = time.time_ns() // 1_000_000
            rows = self._rows
            rows.append((batch_size, total_ns, queue_ns, *timings, single))
            if len(rows) >= FOLD_ROWS:
                self.fold()
            if self.latency_recorder is not None:
                self.latency_recorder.observe(total_ns, queue_ns, timings)
            return
        if single:
            self.record_execution(batch_size, *timings)
        self._add(batch_size, total_ns, queue_ns, *timings)
        if self.latency_recorder is not None:
            self.latency_recorder.observe(total_ns, queue_ns, timings)

    def _add(self, batch_size: int, total_ns: int, queue_ns: int, ci_ns: int, inf_ns: int, co_ns: int) -> None:
        """One success added up (the slow path, and rows a fold cannot take)."""
        self._inferences += batch_size
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
        d = self._input
        d.count += 1
        d.ns += ci_ns
        d = self._infer
        d.count += 1
        d.ns += inf_ns
        d = self._output
        d.count += 1
        d.ns += co_ns

    def fold(self) -> None:
        """Add up the successes kept as rows (:meth:`record_success`'s fast path): the same sums and latency
        buckets the slow path adds one request at a time."""
        rows = self._rows
        if not rows:
            return
        try:
            a = np.array(rows, dtype=np.int64)
        except OverflowError:  # a value past int64: one at a time
            a = None
        if a is None or a.min() < 0 or a.max() >= _FOLD_MAX:  # the column sums could overflow int64
            for row in rows:
                self._add(*row[:6])
                if row[6]:
                    self._execution(row[0], row[3], row[4], row[5])
            rows.clear()
            return
        rows.clear()
        n = len(a)
        sums = a.sum(axis=0).tolist()
        self._inferences += sums[0]
        for d, ns in ((self._success, sums[1]), (self._queue, sums[2]), (self._input, sums[3]),
                      (self._infer, sums[4]), (self._output, sums[5])):
            d.count += n
            d.ns += ns
        v = a[:, 1] >> 8  # latency_bucket, for every row at once
        b = np.frexp(v.astype(np.float64))[1]  # int.bit_length: exact below 2**53, and from 2**37 on the last bucket
        octave = b * 4 + ((v >> np.maximum(b - 3, 0)) & 3)
        index = np.where(b < 3, v, np.where(b < _LAST_OCTAVE, octave, LATENCY_BUCKETS - 1))
        counts = np.bincount(index, minlength=LATENCY_BUCKETS)
        latency = self.latency
        for i in np.flatnonzero(counts).tolist():
            latency[i] += int(counts[i])
        executions = a[a[:, 6] == 1]
        if len(executions):  # rows that were their own executions: by batch size, as record_execution counts
            self._executions += len(executions)
            sizes = executions[:, 0]
            for size in set(sizes.tolist()):  # (np.unique's first call imports and compiles what a set does not need)
                one = executions[sizes == size]
                ci, inf, co = one[:, 3:6].sum(axis=0).tolist()
                b = self.batches.get(size)
                if b is None:
                    b = self.batches[size] = BatchStat()
                for d, ns in ((b.compute_input, ci), (b.compute_infer, inf), (b.compute_output, co)):
                    d.count += len(one)
                    d.ns += ns

    def record_cache_hit(self, total_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache (the cache front, on the hub thread): a success that
        queued for no time and ran nothing, so no inference or execution counts (Triton core's
        ``UpdateSuccessCacheHit``)."""
        # written out, as _add's: the loop over (duration, ns) pairs ran twice the bytecodes, once per hit
        d = self._success
        d.count += 1
        d.ns += total_ns
        self._queue.count += 1  # queued for no time
        d = self._cache_hit
        d.count += 1
        d.ns += lookup_ns
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
        self.fold()
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self._executions,
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

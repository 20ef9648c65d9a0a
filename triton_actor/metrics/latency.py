"""Per-request latencies behind ``--metrics-config summary_latencies=true`` / ``histogram_latencies=true``.

Off by default, as in Triton; when off, no :class:`LatencyRecorder` exists and the hot path pays one
``is None`` test. When on, the version's scheduler (owner, in its own greenlet) calls :meth:`observe` once
per successful request: cumulative counts and sums, the recent samples of each stage (for the summaries'
quantiles: the last ``MAX_SAMPLES`` within ``MAX_AGE_S``, a sliding window as prometheus-cpp's summaries
keep), and the bucket counts of ``nv_inference_first_response_histogram_ms`` (for a model that is not
decoupled the first response is the only one: the request's duration). Readers get :meth:`snapshot`.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import Any

STAGES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
MAX_SAMPLES = 4096
MAX_AGE_S = 60.0
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's default buckets


class LatencyRecorder:
    """Summaries (µs per stage) and the first-response histogram (ms) of one model version."""

    __slots__ = ("summaries", "histogram", "count", "sums", "_window", "_buckets", "_clock", "_cache")

    def __init__(self, summaries: bool, histogram: bool, clock: Any = time.monotonic) -> None:
        self.summaries = summaries
        self.histogram = histogram
        self.count = 0
        self.sums = [0] * len(STAGES)
        self._window: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=MAX_SAMPLES)
        self._buckets = [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1)
        self._clock = clock
        # the response cache's hit and miss durations (nv_cache_hit/miss_summary_per_model): [count, sum ns,
        # recent (time, µs)]; made at the first observation, so versions without the cache carry none
        self._cache: dict[str, list[Any]] | None = None

    def observe_cache(self, kind: str, ns: int) -> None:
        """One cache ``"hit"`` (lookup) or ``"miss"`` (lookup + insertion), from the version's cache front."""
        if self._cache is None:
            self._cache = {k: [0, 0, deque(maxlen=MAX_SAMPLES)] for k in ("hit", "miss")}
        entry = self._cache[kind]
        entry[0] += 1
        entry[1] += ns
        if self.summaries:
            entry[2].append((self._clock(), ns // 1000))

    def observe(self, total_ns: int, queue_ns: int, timings: tuple[int, int, int]) -> None:
        """One successful request (scheduler's greenlet)."""
        ns = (total_ns, queue_ns, *timings)
        self.count += 1
        sums = self.sums  # ns, so that the sums match the *_duration_us counters (which sum ns too)
        for i, v in enumerate(ns):
            sums[i] += v
        if self.summaries:
            self._window.append((self._clock(), tuple(v // 1000 for v in ns)))
        if self.histogram:
            self._buckets[bisect.bisect_left(FIRST_RESPONSE_BUCKETS_MS, total_ns / 1e6)] += 1

    def snapshot(self) -> dict[str, Any]:
        """Plain data: ``samples`` (per stage, µs, the recent window), ``count``, ``sums`` (µs), ``buckets``."""
        horizon = self._clock() - MAX_AGE_S
        while self._window and self._window[0][0] < horizon:
            self._window.popleft()
        recent = [s for _, s in self._window]
        snap: dict[str, Any] = {"count": self.count, "sums": [v // 1000 for v in self.sums]}  # µs
        if self.summaries:
            snap["samples"] = {stage: [s[i] for s in recent] for i, stage in enumerate(STAGES)}
        if self.histogram:
            snap["buckets"] = list(self._buckets)
            snap["bounds"] = list(FIRST_RESPONSE_BUCKETS_MS)
        if self._cache is not None and self.summaries:
            snap["cache"] = {}
            for kind, (count, total_ns, window) in self._cache.items():
                while window and window[0][0] < horizon:
                    window.popleft()
                snap["cache"][kind] = {"count": count, "sum": total_ns // 1000, "samples": [v for _, v in window]}
        return snap

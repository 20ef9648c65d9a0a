"""The successes a version's statistics keep as rows (the fast path) add up to what the slow path adds one
request at a time: the same counts, durations, latency buckets and executions by batch size, whatever the
values, the mix of calls and the reads between."""

from __future__ import annotations

import random

import pytest

from triton_actor.metrics import statistics
from triton_actor.metrics.statistics import FOLD_ROWS, LATENCY_BUCKETS, VersionStats, latency_bucket
from triton_actor.runtime import fastpath


def _ns(rng: random.Random, top: int) -> int:
    """Latencies under ``2**top`` over every octave the buckets have, their edges, and past the last one."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randrange(0, 4096)
    if kind == 1:
        return (1 << rng.randrange(8, top)) + rng.choice((-1, 0))
    if kind == 2:
        return rng.randrange(0, 1 << top)
    return rng.randrange(0, 10**9)


def _record(stats: VersionStats, rows: list[tuple[int, int, int, tuple[int, int, int]]], fast: bool,
            reads: set[int], monkeypatch: pytest.MonkeyPatch, kinds: list[int] | None = None) -> list[dict]:
    """Each row as a success (kind 0), an execution of one answered request (1: ``record_success``'s ``single``), or an
    execution recorded apart before its success (2); the snapshots taken, less their wall-clock field."""
    monkeypatch.setattr(fastpath, "enabled", fast)
    seen = []
    for i, (batch, total, queue, timings) in enumerate(rows):
        kind = kinds[i] if kinds is not None else 0
        if kind == 2:
            stats.record_execution(batch, *timings)
        stats.record_success(batch, total, queue, timings, kind == 1)
        if i in reads:  # a reader between the records (the statistics API, a scrape)
            seen.append(stats.snapshot())
    seen.append(stats.snapshot())
    for snap in seen:
        del snap["last_inference"]
    return seen


# 50: any real latency (13 days), added up by numpy; 64: past what a fold's sums hold, added one at a time
@pytest.mark.parametrize("top", [50, 64])
@pytest.mark.parametrize("seed", range(4))
def test_rows_add_up_as_the_slow_path_adds(seed: int, top: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    rows = [(rng.randrange(1, 9), _ns(rng, top), rng.randrange(0, 1 << 40),
             (rng.randrange(0, 1 << 40), rng.randrange(0, 1 << 40), rng.randrange(0, 1 << 40)))
            for _ in range(rng.randrange(1, 3 * FOLD_ROWS))]
    reads = set(rng.sample(range(len(rows)), min(len(rows), 3)))
    kinds = [rng.randrange(3) for _ in rows]
    fast = _record(VersionStats("m", 1), rows, True, reads, monkeypatch, kinds)
    slow = _record(VersionStats("m", 1), rows, False, reads, monkeypatch, kinds)
    assert fast == slow
    assert sum(slow[-1]["latency"]) == len(rows)
    assert slow[-1]["execution_count"] == sum(1 for k in kinds if k)
    assert sum(b[0] for b in slow[-1]["batches"].values()) == sum(1 for k in kinds if k)


def test_the_vectorised_bucket_is_latency_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "enabled", True)
    values = [0, 1, 255, 256, 511, 512, 2047, 2048, 2049, *(1 << k for k in range(8, 63)),
              *((1 << k) - 1 for k in range(9, 63)), (1 << 63) - 1]
    for ns in values:
        stats = VersionStats("m", 1)
        stats.record_success(1, ns, 0, (0, 0, 0))
        latency = stats.snapshot()["latency"]
        assert latency[latency_bucket(ns)] == 1, ns
        assert len(latency) == LATENCY_BUCKETS


def test_rows_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "enabled", True)
    stats = VersionStats("m", 1)
    for _ in range(5 * statistics.FOLD_ROWS + 3):
        stats.record_success(1, 1000, 0, (0, 0, 0))
        assert len(stats._rows) < statistics.FOLD_ROWS
    assert stats.inference_count == 5 * statistics.FOLD_ROWS + 3

"""Candidates, measured points and how they are ranked: pure values, no I/O.

A *candidate* is one setting of the tuned fields of a model's config. A *point* is one candidate measured
at one client concurrency (Model Analyzer's "measurement"). The objective ranks points, as Model
Analyzer's do: ``throughput`` is the most inferences per second whose p99 latency is within the budget;
``latency`` is the lowest p99 (throughput breaks ties). A candidate is as good as its best point.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OBJECTIVES = ("throughput", "latency")


@dataclass(frozen=True, slots=True)
class Candidate:
    """The tuned fields. ``max_batch_size`` 0 means the model takes no batch dimension (not tuned then)."""

    instances: int
    max_batch_size: int
    dynamic_batching: bool
    preferred: tuple[int, ...] = ()
    queue_delay_us: int = 0
    isolation: str = ""  # a Python model's TRITON_ACTOR_ISOLATION: "thread", "process", "" (the server's default)
    workers: int = 0  # the server's --workers (a restart, not a config field); 0: as the server was started
    kind: str = ""  # the instance group's kind, "KIND_CPU" or "KIND_GPU"; "": as the config has it
    model: str = ""  # an ensemble's composing model these fields are for; "": the tuned model itself

    def label(self) -> str:
        where = f"{self.model}: " if self.model else ""
        kind = " GPU" if self.kind == "KIND_GPU" else ""
        text = f"{where}{self.instances} inst{kind}{' (process)' if self.isolation == 'process' else ''}, batch {self.max_batch_size}"
        if self.workers:
            text = f"{self.workers} worker{'s' if self.workers > 1 else ''}, " + text
        if not self.dynamic_batching:
            return text + ", no dynamic batching"
        text += f", dynamic (delay {self.queue_delay_us} us"
        return text + (f", preferred {list(self.preferred)})" if self.preferred else ")")


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement. ``error`` is set when the candidate failed to load or every request failed."""

    candidate: Candidate
    concurrency: int  # closed loop: requests in flight (0 in the open loop)
    throughput: float = 0.0  # inferences per second over the stable windows
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    cv_pct: float = 0.0  # coefficient of variation of the windows' throughput: the machine's noise
    stable: bool = False  # the windows settled under the stability threshold
    windows: int = 0
    loadgen_cpu_pct: float = 0.0  # the load generator's CPU, % of one core, while it measured
    server_cpu_pct: float = 0.0  # the started server's CPU over the point, % of one core (0 when attached)
    queue_us: float = 0.0  # the server's statistics over the point: queue time per request
    compute_us: float = 0.0  # and compute (infer) time per execution
    errors: int = 0  # failed requests
    error: str = ""
    request_rate: float = 0.0  # open loop: the offered rate, requests per second (0 in the closed loop)

    @property
    def ok(self) -> bool:
        return not self.error and self.throughput > 0

    @property
    def level(self) -> float:
        """The load it was measured at: the offered rate in the open loop, else the concurrency."""
        return self.request_rate or self.concurrency

    def load_label(self) -> str:
        return f"r={self.request_rate:g}/s" if self.request_rate else f"c={self.concurrency}"

    def load_words(self) -> str:
        return f"request rate {self.request_rate:g}/s" if self.request_rate else f"concurrency {self.concurrency}"


def meets(point: Point, budget_ms: float | None) -> bool:
    return point.ok and (budget_ms is None or point.p99_ms <= budget_ms)


def rank_key(point: Point, objective: str) -> tuple[float, float]:
    """Bigger is better."""
    if objective == "latency":
        return (-point.p99_ms, point.throughput)
    return (point.throughput, -point.p99_ms)


def pick(points: Iterable[Point], objective: str, budget_ms: float | None) -> tuple[Point | None, bool]:
    """The best point within the budget (of the stable ones, when there are any), and True; or, when none
    meets it, the closest one and False."""
    good = [p for p in points if p.ok]
    within = [p for p in good if meets(p, budget_ms)]
    steady = [p for p in within if p.stable]  # a figure that never settled is a lucky window as often as not
    if within:
        return max(steady or within, key=lambda p: rank_key(p, objective)), True
    if not good:
        return None, False
    return min(good, key=lambda p: (p.p99_ms, -p.throughput)), False


def better(new: tuple[Point | None, bool], old: tuple[Point | None, bool], objective: str, min_gain: float) -> bool:
    """Whether the score ``new`` (a candidate's best point, and whether it met the budget) beats ``old`` by
    more than ``min_gain`` (a fraction): a direction that gains less has stopped helping. A candidate
    within the budget beats one outside it; outside, the lower p99 is closer."""
    (p, met), (q, q_met) = new, old
    if p is None:
        return False
    if q is None:
        return True
    if met != q_met:
        return met
    if objective == "latency" or not met:
        return p.p99_ms < q.p99_ms * (1 - min_gain)
    return p.throughput > q.throughput * (1 + min_gain)


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by p99."""
    good = sorted((p for p in points if p.ok), key=lambda p: (p.p99_ms, -p.throughput))
    front: list[Point] = []
    for p in good:
        if not front or p.throughput > front[-1].throughput:
            front.append(p)
    return front

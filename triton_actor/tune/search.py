"""The search: coordinate climbs from the model's own config, stopped where a direction stops helping.

Pure: it is given ``measure(candidate, level) -> Point`` and a clock check, so the unit tests run it
on a simulated model. Model Analyzer's quick mode is the bar: it hill-climbs instance count and batch size
from a start point; we climb one field at a time, in the order that usually matters most on a CPU host,
and let the server's own statistics prune and seed the climbs:

1. the shipped config, measured first (the baseline every gain is stated against); when it takes a batch
   dimension but has no dynamic batching, dynamic batching right after, before any instance climb:
   instances climbed first fill the concurrency batching needs, and batching tried after them shows no
   gain (measured: a 10 ms-per-batch Python model kept 2 unbatched instances at 179/s; batched, one did 800/s);
2. instance count, up by doubling when requests queue for an instance (queue time per request at
   least a tenth of compute time per execution; less means the instances are not what requests wait
   for) or the busiest point broke the budget, then down when up did not help;
3. for a model that takes a batch dimension: dynamic batching on/off, ``max_batch_size`` up then down,
   ``max_queue_delay_microseconds`` from the measured compute time per execution (half, one, two, four
   times it: waiting longer than a batch takes to run rarely pays), preferred batch sizes;
4. instance count again around the new best (batching moves where the instances stop helping).

Between 2 and 3, a Python model tries its other execution (in-process / a process per instance), a host
with a GPU the other instance kind (KIND_CPU / KIND_GPU), and a server started by the tuner more worker
processes (``--workers``: the one field that costs a restart); the instance count climbs again after any
of them won.

The load levels are client concurrencies (closed loop) or offered request rates (open loop): the search
only orders them; ``measure`` knows which they are.

Each candidate is measured at the load levels upward, stopping at the first that breaks the latency
budget (more load only adds latency) or when two in a row gain less than ``min_gain`` throughput
(saturated). Where a candidate starts: for the throughput objective, the shipped config at the
lower-middle level (the lowest one matters only when that one breaks the budget, and is then
measured) and every later candidate at the level of the best candidate's best point (a neighbour
of the best is decided near it: a level below it cannot beat it in a closed loop); a start over
the budget walks down until a level meets it, or until a level serves less than the best does (fewer
clients cannot serve more: nothing lower can win). The latency objective starts every candidate at the
lowest level (its best point is there). A climb ends after ``PATIENCE`` + 1 steps in a row that gain less than ``min_gain``, and at
once at a candidate that fails to load (it scores nothing). The search ends
early when the point budget or the time is spent; the points measured so far stay in ``points``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .points import Candidate, Point, better, meets, pick

Score = tuple[Point | None, bool]
PATIENCE = 1  # steps of a climb that may fail to gain before the direction stops
QUEUEING_SHARE = 0.1  # queue time at least this share of compute time: requests wait for an instance


class OutOfBudget(Exception):
    """The point budget or the time is spent (internal: ends the climbs)."""


@dataclass(frozen=True, slots=True)
class Space:
    """The values each field may take; an empty ``batch_sizes`` leaves batching untouched."""

    instances: tuple[int, ...]
    batch_sizes: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = (True, False)
    queue_delays_us: tuple[int, ...] | None = None  # None: derived from the measured compute time
    preferred: bool = True
    isolation: tuple[str, ...] = ()  # a Python model's modes to try ("thread", "process"); () leaves it
    kinds: tuple[str, ...] = ()  # instance kinds other than the config's to try ("KIND_GPU"...); () leaves it
    workers: tuple[int, ...] = ()  # --workers values to try (each a server restart); () leaves it


def default_space(origin: Candidate, cores: int) -> Space:
    """Instances 1..2 x cores by doubling (and the shipped count); batch sizes 1..128 by doubling (and the
    shipped one) when the model takes a batch dimension."""
    instances = doubling(1, max(2 * cores, 1)) | {origin.instances}
    batches = doubling(1, 128) | {origin.max_batch_size} if origin.max_batch_size > 0 else set()
    return Space(tuple(sorted(instances)), tuple(sorted(batches)))


def doubling(low: int, high: int) -> set[int]:
    out, v = {high}, low
    while v < high:
        out.add(v)
        v *= 2
    return out


class Search:
    """One run. ``measure`` runs in the caller's thread; ``on_point`` is told of every point."""

    def __init__(self, origin: Candidate, space: Space, levels: Sequence[int],
                 measure: Callable[[Candidate, int], Point], *, objective: str = "throughput",
                 budget_ms: float | None = None, max_points: int = 200, out_of_time: Callable[[], bool] = lambda: False,
                 min_gain: float = 0.05, on_point: Callable[[Point], None] = lambda p: None) -> None:
        self.origin, self.space, self.levels = origin, space, sorted(set(levels))
        self.measure, self._on_point, self._out_of_time = measure, on_point, out_of_time
        self.objective, self.budget_ms, self.max_points, self.min_gain = objective, budget_ms, max_points, min_gain
        self.points: list[Point] = []
        self.scores: dict[Candidate, Score] = {}
        self.best: Candidate = origin
        self.exhausted = False  # the point budget or the time ran out before the climbs ended

    def plan_size(self) -> int:
        """An upper bound of the points this search measures (for the progress bar's ETA)."""
        batching = len(self.space.batch_sizes) + 1 + 4 + 2 if self.space.batch_sizes else 0
        rounds = 2 + bool(self.space.isolation) + bool(self.space.kinds) + bool(self.space.workers)  # instance climbs
        others = len(self.space.isolation) + len(self.space.kinds) + len(self.space.workers)
        steps = 1 + rounds * len(self.space.instances) + others + batching
        return min(self.max_points, len(self.levels) * steps)

    def run(self) -> None:
        try:
            self._evaluate(self.origin)
            if self.space.batch_sizes and self.origin.max_batch_size > 0 and not self.origin.dynamic_batching \
                    and True in self.space.dynamic:
                self._try(replace(self.best, dynamic_batching=True))  # before the instances: see the docstring
            self._instances()
            for other in (self._isolation, self._kind, self._workers):
                if other():
                    self._instances()
            if self.space.batch_sizes and self.origin.max_batch_size > 0:
                self._batching()
                self._instances()
        except OutOfBudget:
            self.exhausted = True

    # ---- climbs --------------------------------------------------------------------------------------

    def _instances(self) -> None:
        n = self.best.instances
        up = [v for v in self.space.instances if v > n]
        down = [v for v in reversed(self.space.instances) if v < n]
        if not (up and self._instances_may_help() and self._climb(lambda v: replace(self.best, instances=v), up)):
            self._climb(lambda v: replace(self.best, instances=v), down)

    def _isolation(self) -> bool:
        """The other execution of a Python model (a process per instance runs beside the GIL, at a copy
        per request); whether it won. An unset mode is the server's default, in-process."""
        current, won = self.best.isolation or "thread", False
        for mode in [m for m in self.space.isolation if m != current]:
            won = self._try(replace(self.best, isolation=mode)) or won
        return won

    def _kind(self) -> bool:
        """The instance kinds the config does not have (``kinds`` leaves out its own; empty where the host
        has no GPU: ``command.instance_kinds``); whether one won."""
        won = False
        for kind in [k for k in self.space.kinds if k != self.best.kind]:
            won = self._try(replace(self.best, kind=kind)) or won
        return won

    def _workers(self) -> bool:
        """More worker processes, up by doubling (each a restart of the server: the load API cannot change
        them); whether any won. An unset count is the server's own, one."""
        n = self.best.workers or 1
        return self._climb(lambda v: replace(self.best, workers=v), [v for v in self.space.workers if v > n])

    def _batching(self) -> None:
        for dynamic in self.space.dynamic:
            if dynamic != self.best.dynamic_batching:
                self._try(replace(self.best, dynamic_batching=dynamic))
        if not self.best.dynamic_batching:
            return  # without a batcher each request runs alone: the batch fields change nothing
        b = self.best.max_batch_size
        up = [v for v in self.space.batch_sizes if v > b]
        down = [v for v in reversed(self.space.batch_sizes) if v < b]
        if not self._climb(self._with_batch, up):
            self._climb(self._with_batch, down)
        delays = [v for v in self._queue_delays() if v > self.best.queue_delay_us]
        self._climb(lambda v: replace(self.best, queue_delay_us=v), delays)
        if self.space.preferred:
            b = self.best.max_batch_size
            for preferred in ((b,), (b // 2, b)) if b >= 2 else ((b,),):
                self._try(replace(self.best, preferred=preferred))

    def _with_batch(self, size: int) -> Candidate:
        """The best with another ``max_batch_size``; preferred sizes above it go (Triton refuses them), and
        the server's default preferred size (the old maximum, core's normalization) follows the new one."""
        best = self.best
        preferred = tuple(p for p in best.preferred if p <= size)
        if best.preferred == (best.max_batch_size,):
            preferred = (size,)
        return replace(best, max_batch_size=size, preferred=preferred)

    def _queue_delays(self) -> list[int]:
        if self.space.queue_delays_us is not None:
            return sorted(self.space.queue_delays_us)
        point = self.scores[self.best][0]
        compute = point.compute_us if point is not None and point.compute_us > 0 else 500.0
        return sorted({max(1, round(compute * f)) for f in (0.5, 1, 2, 4)})

    def _instances_may_help(self) -> bool:
        """At the best candidate's busiest point: requests waited for an instance (the statistics), or the
        latency broke the budget (more executions side by side may bring it back under)."""
        mine = [p for p in self.points if p.candidate == self.best and p.ok]
        if not mine or max(p.compute_us for p in mine) <= 0:
            return True  # no statistics (an attached server without them): climb anyway
        busiest = max(mine, key=lambda p: p.level)
        return busiest.queue_us >= QUEUEING_SHARE * busiest.compute_us or not meets(busiest, self.budget_ms)

    def _climb(self, make: Callable[[int], Candidate], values: Sequence[int]) -> bool:
        """Try ``values`` in order until ``PATIENCE`` + 1 steps in a row do not beat the best; whether any
        did, and at once at a candidate that failed. One step of patience crosses a plateau: under a latency budget, two instances may serve no
        more than one (the next concurrency breaks the budget either way) where four serve twice as much."""
        moved, misses = False, 0
        for v in values:
            candidate = make(v)
            if self._try(candidate):
                moved, misses = True, 0
                continue
            misses += 1
            if misses > PATIENCE or self.scores[candidate][0] is None:
                break  # a candidate that did not load: further along fails the same way (memory, size)
        return moved

    def _try(self, candidate: Candidate) -> bool:
        score = self._evaluate(candidate)
        if candidate != self.best and better(score, self.scores[self.best], self.objective, self.min_gain):
            self.best = candidate
            return True
        return False

    # ---- one candidate -----------------------------------------------------------------------------

    def _evaluate(self, candidate: Candidate) -> Score:
        if candidate in self.scores:
            return self.scores[candidate]
        mine: list[Point] = []
        try:
            start = self._start(candidate)
            for level in self.levels[start:]:
                point = self._measure(candidate, level, mine)
                if not point.ok or not meets(point, self.budget_ms) or self._saturated(mine):
                    break
            if mine[0].ok and not meets(mine[0], self.budget_ms):  # started over the budget: walk down
                for level in reversed(self.levels[:start]):
                    if self._cannot_win(mine[-1]):
                        break
                    point = self._measure(candidate, level, mine)
                    if not point.ok or meets(point, self.budget_ms):
                        break
        finally:  # OutOfBudget too: what was measured still scores
            self.scores[candidate] = pick(mine, self.objective, self.budget_ms)
        return self.scores[candidate]

    def _start(self, candidate: Candidate) -> int:
        """The index of the level a candidate's measurement starts at (the module's docstring says why)."""
        if self.objective == "latency" or len(self.levels) < 3:
            return 0
        incumbent = self.scores.get(self.best, (None, False))[0] if candidate != self.origin else None
        if incumbent is None:
            return (len(self.levels) - 1) // 2
        return min(range(len(self.levels)), key=lambda i: abs(self.levels[i] - incumbent.level))

    def _cannot_win(self, point: Point) -> bool:
        """Walking down from ``point``: whether no lower level can beat the best (throughput objective, the
        best within the budget). A closed loop with fewer clients serves no more, so a point that already
        serves less than the best's gain threshold ends the walk, whatever its latency."""
        incumbent, met = self.scores.get(self.best, (None, False))
        return (self.objective == "throughput" and met and incumbent is not None
                and point.throughput < incumbent.throughput * (1 + self.min_gain))

    def _measure(self, candidate: Candidate, level: int, mine: list[Point]) -> Point:
        if len(self.points) >= self.max_points or self._out_of_time():
            raise OutOfBudget
        point = self.measure(candidate, level)
        self.points.append(point)
        mine.append(point)
        self._on_point(point)
        return point

    def _saturated(self, mine: list[Point]) -> bool:
        """``PATIENCE`` + 1 concurrencies in a row gained less than ``min_gain``: one noisy dip (a busy host
        between two points) must not hide what more clients would have shown."""
        steps = PATIENCE + 1
        if len(mine) <= steps or self.objective == "latency":
            return False
        best_before = max(p.throughput for p in mine[:-steps])
        return all(p.throughput < best_before * (1 + self.min_gain) for p in mine[-steps:])

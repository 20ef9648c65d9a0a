"""The search (``triton_actor/tune/search.py``) on a simulated model whose surface is known.

The simulated model: ``cores`` usable cores (instances beyond them contend), an execution of a batch of
``b`` takes ``1 + 0.25 b`` ms (in a process per instance; in-process 1/0.6 of that, the interpreter lock), the dynamic batcher gathers up to ``min(max_batch_size, clients per
instance)``, and a closed loop of ``c`` clients sees ``max(execution + queue delay, c / capacity)``. The
search must reach (within its min_gain) the optimum a brute force over the whole grid finds, in a fraction
of the brute force's points.
"""

from __future__ import annotations

import itertools
import math

import pytest

from triton_actor.tune.points import Candidate, Point, pick
from triton_actor.tune.search import Search, Space, default_space

CORES = 4
CONCURRENCIES = (1, 4, 16, 64)
ORIGIN = Candidate(instances=1, max_batch_size=8, dynamic_batching=True)
SPACE = default_space(ORIGIN, cores=4)  # instances 1, 2, 4, 8; batch sizes 1..128


def simulate(c: Candidate, clients: int, refuse_above: int = 10**9) -> Point:
    if c.max_batch_size > refuse_above:
        return Point(c, clients, error="load failed: out of memory")
    per_instance = math.ceil(clients / c.instances)
    b = min(per_instance, c.max_batch_size) if c.dynamic_batching else 1
    gil = 1.0 if c.isolation == "process" else 0.6  # in-process instances share one interpreter lock
    exec_ms = (1.0 + 0.25 * b) / gil
    capacity = min(c.instances, CORES) * 0.85 ** max(0, c.instances - CORES) * b * 1000 / exec_ms
    latency_s = max((exec_ms + c.queue_delay_us / 1000) / 1000, clients / capacity)
    return Point(c, clients, throughput=clients / latency_s, p50_ms=latency_s * 1000, p95_ms=latency_s * 1100,
                 p99_ms=latency_s * 1200, stable=True, queue_us=max(0.0, latency_s * 1e6 - exec_ms * 1000),
                 compute_us=exec_ms * 1000)


def brute_force(budget_ms: float | None, objective: str = "throughput") -> tuple[Point | None, int]:
    points = [simulate(Candidate(n, b, db), c) for n, b, db, c in
              itertools.product(SPACE.instances, SPACE.batch_sizes, (True, False), CONCURRENCIES)]
    return pick(points, objective, budget_ms)[0], len(points)


@pytest.mark.parametrize("budget_ms", [None, 10.0, 3.0])
def test_finds_the_optimum_within_its_point_budget(budget_ms: float | None) -> None:
    best, brute_points = brute_force(budget_ms)
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, budget_ms=budget_ms, max_points=60)
    search.run()
    chosen, met = pick(search.points, "throughput", budget_ms)
    assert met and chosen is not None and best is not None
    assert chosen.throughput >= best.throughput * 0.95, (chosen, best)
    assert not search.exhausted and len(search.points) <= 60 and len(search.points) * 4 < brute_points


def test_latency_objective_finds_the_lowest_p99() -> None:
    best, _ = brute_force(None, "latency")
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, objective="latency", max_points=60)
    search.run()
    chosen, _ = pick(search.points, "latency", None)
    assert chosen is not None and best is not None and chosen.p99_ms <= best.p99_ms * 1.05


def test_a_candidate_that_fails_to_load_is_recorded_and_the_search_goes_on() -> None:
    search = Search(ORIGIN, SPACE, CONCURRENCIES, lambda c, n: simulate(c, n, refuse_above=16), max_points=60)
    search.run()
    failed = [p for p in search.points if p.error]
    assert failed and all(p.candidate.max_batch_size > 16 for p in failed)
    assert len({p.candidate for p in failed}) == 1  # the failure ends the direction: 32 only, never 64
    assert search.best.max_batch_size == 16 and not search.exhausted


def test_a_budget_no_configuration_meets_gives_the_closest() -> None:
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, budget_ms=0.5, max_points=60)
    search.run()
    chosen, met = pick(search.points, "throughput", 0.5)
    assert not met and chosen is not None
    assert chosen.p99_ms == min(p.p99_ms for p in search.points if p.ok)


def test_the_point_budget_and_the_clock_end_the_search_with_what_was_measured() -> None:
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, max_points=5)
    search.run()
    assert search.exhausted and len(search.points) == 5
    ticks = iter(range(100))
    timed = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, out_of_time=lambda: next(ticks) >= 3)
    timed.run()
    assert timed.exhausted and len(timed.points) == 3


def test_no_queueing_skips_more_instances() -> None:
    """At one client nothing waits for an instance: the statistics say more instances cannot help."""
    search = Search(ORIGIN, Space(instances=(1, 2, 4, 8)), (1,), simulate, max_points=60)
    search.run()
    assert {p.candidate.instances for p in search.points} == {1}


def test_a_model_without_a_batch_dimension_tunes_instances_only() -> None:
    origin = Candidate(instances=1, max_batch_size=0, dynamic_batching=False)
    search = Search(origin, default_space(origin, cores=4), CONCURRENCIES, simulate, max_points=60)
    search.run()
    assert {(p.candidate.max_batch_size, p.candidate.dynamic_batching) for p in search.points} == {(0, False)}
    assert search.best.instances == CORES


def test_plan_size_bounds_the_points() -> None:
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, max_points=500)
    search.run()
    assert len(search.points) <= search.plan_size()


def test_a_python_model_tries_the_other_execution_and_keeps_the_winner() -> None:
    space = Space(instances=SPACE.instances, batch_sizes=SPACE.batch_sizes, isolation=("thread", "process"))
    search = Search(ORIGIN, space, CONCURRENCIES, simulate, max_points=80)
    search.run()
    assert search.best.isolation == "process" and search.best.instances == CORES
    assert {p.candidate.isolation for p in search.points} == {"", "process"}
    plain = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, max_points=80)  # not a Python model: never tried
    plain.run()
    assert {p.candidate.isolation for p in plain.points} == {""}


def test_one_dip_in_throughput_does_not_end_the_concurrency_sweep() -> None:
    levels = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # the shipped config starts at the lower middle: 16
    rates = {16: 100.0, 32: 90.0, 64: 400.0, 128: 390.0, 256: 380.0, 512: 370.0}  # a busy minute at 32 clients

    def measure(c: Candidate, clients: int) -> Point:
        return Point(c, clients, throughput=rates[clients], p99_ms=1.0, stable=True)

    search = Search(ORIGIN, Space(instances=(1,)), levels, measure, max_points=10)
    search.run()
    assert [p.concurrency for p in search.points] == [16, 32, 64, 128, 256]  # 128 and 256 gain nothing: the end
    rates.update({64: 95.0})
    flat = Search(ORIGIN, Space(instances=(1,)), levels, measure, max_points=10)
    flat.run()
    assert [p.concurrency for p in flat.points] == [16, 32, 64]  # two steps without a gain


def test_candidates_start_at_the_best_level_and_walk_down_only_over_the_budget() -> None:
    """The shipped config starts at the lower-middle level; each later candidate at the level of the best
    point so far, and below it only when that start broke the budget (a lower level cannot serve more in
    a closed loop). Against the same search with every candidate swept from the lowest level (the
    search before: 56, 49, 33 points for these budgets), it measures far fewer points and picks the
    brute force's optimum all the same."""
    for budget, most in ((None, 20), (10.0, 30), (3.0, 30)):
        best, _ = brute_force(budget)
        search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, budget_ms=budget, max_points=200)
        search.run()
        chosen, met = pick(search.points, "throughput", budget)
        assert met and chosen is not None and best is not None and chosen.throughput >= best.throughput * 0.95
        assert len(search.points) <= most, (budget, len(search.points))
        assert search.points[0].concurrency == 4  # the lower middle of 1, 4, 16, 64
        seen: dict[Candidate, list[Point]] = {}
        for p in search.points:
            seen.setdefault(p.candidate, []).append(p)
        for mine in seen.values():
            first, lower = mine[0], [p for p in mine[1:] if p.concurrency < mine[0].concurrency]
            assert not lower or first.p99_ms > (budget or math.inf), mine  # below the start only over the budget
            if lower:  # down until one met the budget, then no further
                assert all(p.p99_ms > budget for p in lower[:-1]), mine  # type: ignore[operator]


def test_the_latency_objective_starts_every_candidate_at_the_lowest_level() -> None:
    search = Search(ORIGIN, SPACE, CONCURRENCIES, simulate, objective="latency", max_points=60)
    search.run()
    firsts = {}
    for p in search.points:
        firsts.setdefault(p.candidate, p.concurrency)
    assert set(firsts.values()) == {1}


def _workers_and_kind(c: Candidate, clients: int) -> Point:
    """One worker serves 500/s whatever its instances (the interpreter lock); each more worker adds as
    much, up to the 4 cores; a GPU instance runs twice as fast. Instances help only beyond one worker."""
    workers = c.workers or 1
    rate = 500.0 * min(workers, CORES) * (2 if c.kind == "KIND_GPU" else 1) * min(c.instances, workers) ** 0.5
    rate = min(rate, clients * 1000.0)
    latency_ms = clients / rate * 1000
    return Point(c, clients, throughput=rate, p50_ms=latency_ms, p95_ms=latency_ms, p99_ms=latency_ms, stable=True,
                 queue_us=latency_ms * 500, compute_us=latency_ms * 500)


def test_more_workers_are_tried_by_doubling_and_the_instances_climb_again() -> None:
    space = Space(instances=(1, 2, 4), workers=(2, 4))
    search = Search(Candidate(1, 0, False), space, (4, 16), _workers_and_kind, max_points=60)
    search.run()
    assert search.best.workers == 4 and search.best.instances == 4
    tried = [p.candidate.workers for p in search.points]
    assert tried.index(4) > tried.index(2)  # 2 before 4: each a restart, so never more than the climb needs
    none = Search(Candidate(1, 0, False), Space(instances=(1, 2, 4)), (4, 16), _workers_and_kind, max_points=60)
    none.run()  # attached (--url) or an ensemble: the server is never restarted
    assert {p.candidate.workers for p in none.points} == {0}


def test_the_other_instance_kind_is_tried_only_where_the_space_names_it() -> None:
    gpu = Search(Candidate(1, 0, False), Space(instances=(1,), kinds=("KIND_GPU",)), (4,), _workers_and_kind)
    gpu.run()
    assert gpu.best.kind == "KIND_GPU"
    cpu_only = Search(Candidate(1, 0, False), Space(instances=(1,)), (4,), _workers_and_kind)
    cpu_only.run()
    assert {p.candidate.kind for p in cpu_only.points} == {""}


def test_request_rates_are_load_levels_as_concurrencies_are() -> None:
    """Open loop: the search sweeps rates upward and stops at the first over the budget."""
    def measure(c: Candidate, rate: int) -> Point:
        served = min(rate, 300.0 * c.instances)
        p99 = 5.0 if rate <= served else 500.0  # past saturation the backlog grows: latency explodes
        return Point(c, 0, request_rate=rate, throughput=served, p50_ms=p99, p95_ms=p99, p99_ms=p99, stable=True)

    search = Search(Candidate(1, 0, False), Space(instances=(1, 2, 4)), (100, 200, 400, 800), measure,
                    budget_ms=50.0, max_points=40)
    search.run()
    first = [p.request_rate for p in search.points if p.candidate.instances == 1]
    assert first == [200, 400]  # from the lower middle; 400/s broke the budget: 800/s is not measured
    best, met = pick(search.points, "throughput", 50.0)
    assert met and best is not None and best.request_rate == 800 and best.candidate.instances >= 4


def test_a_walk_down_ends_where_nothing_lower_can_win() -> None:
    """Two instances break the budget at the best's level (16) serving less than the best: fewer clients
    serve less still, so the walk down stops there instead of measuring 4 and 1."""
    def measure(c: Candidate, clients: int) -> Point:
        rate = {1: 100.0, 4: 300.0, 16: 900.0, 64: 950.0}[clients] * (0.5 if c.instances == 2 else 1)
        p99 = {1: 1.0, 4: 2.0, 16: 8.0, 64: 40.0}[clients] * (2 if c.instances == 2 else 1)
        return Point(c, clients, throughput=rate, p99_ms=p99, stable=True, queue_us=100, compute_us=100)

    search = Search(ORIGIN, Space(instances=(1, 2)), CONCURRENCIES, measure, budget_ms=10.0)
    search.run()
    assert [(p.candidate.instances, p.concurrency) for p in search.points] == [(1, 4), (1, 16), (1, 64), (2, 16)]


def test_dynamic_batching_is_tried_before_the_instances_when_the_shipped_config_lacks_it() -> None:
    """A model whose cost is per batch (10 ms whatever its size), shipped without dynamic batching: with
    the instances climbed first, 4 instances at 4 clients batch nothing and batching then shows no gain
    at that level; tried first, batching wins at once and the search goes on from there."""
    def measure(c: Candidate, clients: int) -> Point:
        per_instance = math.ceil(clients / c.instances)
        batch = min(per_instance, c.max_batch_size) if c.dynamic_batching else 1
        rate = min(clients, c.instances * batch) * 100.0  # 10 ms per execution
        latency_ms = clients / rate * 1000
        return Point(c, clients, throughput=rate, p50_ms=latency_ms, p95_ms=latency_ms, p99_ms=latency_ms,
                     stable=True, queue_us=max(0.0, latency_ms - 10) * 1000, compute_us=10_000)

    origin = Candidate(instances=1, max_batch_size=8, dynamic_batching=False)
    space = Space(instances=(1, 2, 4), batch_sizes=(8, 16, 32))
    search = Search(origin, space, CONCURRENCIES, measure, budget_ms=50.0, max_points=80)
    search.run()
    second = next(p.candidate for p in search.points if p.candidate != origin)
    assert second == Candidate(instances=1, max_batch_size=8, dynamic_batching=True)
    best, met = pick(search.points, "throughput", 50.0)
    assert met and best is not None and best.candidate.dynamic_batching and best.throughput >= 1600.0, best

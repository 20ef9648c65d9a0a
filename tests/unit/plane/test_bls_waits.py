"""The BLS wait graph: which calls could never be served (a model calling itself, a cycle) and which only wait."""

from __future__ import annotations

from dataclasses import dataclass

from triton_actor.plane.bls_waits import WaitGraph


@dataclass(eq=False)
class Worker:
    busy: bool = True


def graph(instances: dict[tuple[str, int], list[Worker]]) -> WaitGraph:
    return WaitGraph(lambda version: instances.get(version, []))


A, B = ("a", 1), ("b", 1)


def test_a_model_calling_itself() -> None:
    one = Worker()
    assert not graph({A: [one]}).enter(one, A)  # its only instance is the caller
    two = [Worker(), Worker(busy=False)]
    g = graph({A: two})
    assert g.enter(two[0], A)  # the other instance is idle
    two[1].busy = True
    assert not g.enter(two[1], A)  # now both wait for a
    g.leave(two[0], A)
    assert g.enter(two[1], A)


def test_busy_targets_only_wait() -> None:
    caller, target = Worker(), Worker()  # the target runs something else: it will be free
    assert graph({A: [caller], B: [target]}).enter(caller, B)


def test_a_cycle_through_two_models() -> None:
    a, b = Worker(), Worker()
    g = graph({A: [a], B: [b]})
    assert g.enter(a, B)  # b is running, not waiting
    assert not g.enter(b, A)  # b would wait for a, which waits for b
    assert g.enter(Worker(), A)  # a caller that is not an instance of b or a is not in the cycle


def test_an_idle_caller_does_not_count() -> None:
    a = Worker(busy=False)  # a decoupled model's thread calling after execute() returned
    g = graph({A: [a]})
    assert g.enter(a, A)


def test_unknown_versions_are_not_cycles() -> None:
    w = Worker()
    assert graph({}).enter(w, ("ensemble", 1))


@dataclass
class Ensemble:
    """A fake ensemble scheduler: what a new request calls, what each request in flight still calls."""

    steps: tuple[tuple[str, int], ...]
    runs: list[set[tuple[str, int]]]

    def needs(self) -> tuple[tuple[str, int], ...]:
        return self.steps

    def runs_need(self) -> list[set[tuple[str, int]]]:
        return self.runs


def with_ensembles(instances: dict[tuple[str, int], list[Worker]],
                   ensembles: dict[tuple[str, int], Ensemble]) -> WaitGraph:
    return WaitGraph(lambda v: instances.get(v, []), ensembles.get)


E, F = ("e", 1), ("f", 1)


def test_a_model_calling_an_ensemble_of_itself() -> None:
    a = Worker()
    e = Ensemble((B, A), [])
    g = with_ensembles({A: [a], B: [Worker(busy=False)]}, {E: e})
    assert not g.enter(a, E)  # e's request needs a, whose only instance is the caller
    two = [Worker(), Worker(busy=False)]
    assert with_ensembles({A: two}, {E: e}).enter(two[0], E)  # the other instance of a serves the step


def test_an_ensemble_without_the_caller() -> None:
    a = Worker()
    assert with_ensembles({A: [a], B: [Worker()]}, {E: Ensemble((B,), [])}).enter(a, E)


def test_nested_ensembles() -> None:
    a = Worker()
    g = with_ensembles({A: [a]}, {E: Ensemble((F,), []), F: Ensemble((A,), [])})
    assert not g.enter(a, E)  # e -> f -> a


def test_a_step_that_calls_back() -> None:
    a, b = Worker(), Worker()
    e = Ensemble((B,), [])
    g = with_ensembles({A: [a], B: [b]}, {E: e})
    assert g.enter(a, E)  # b is free: a's request reaches it
    e.runs = [{B}]  # a's request runs b now, and b calls a
    assert not g.enter(b, A)
    assert g.enter(b, ("addsub", 1))  # a call elsewhere only waits


def test_requests_in_flight_need_only_what_is_left() -> None:
    a, b = Worker(), Worker()
    e = Ensemble((A, ("c", 1)), [{("c", 1)}])  # b's request is past a, running c
    g = with_ensembles({A: [a], B: [b], ("c", 1): [Worker()]}, {E: e})
    assert g.enter(b, E)  # a and c run without waiting: b's new request will get them
    assert g.enter(a, B)  # that request no longer needs a: b will be free
    e.runs = [{A, ("c", 1)}]  # not past a yet: a -> b -> e -> a
    assert not g.enter(a, B)
    e.runs = []  # no request in flight (answered, b not yet told): nothing to wait for
    assert g.enter(a, B)

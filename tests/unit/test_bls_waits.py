"""The BLS wait graph: which calls could never be served (a model calling itself, a cycle) and which only wait."""

from __future__ import annotations

from dataclasses import dataclass

from triton_actor.bls_waits import WaitGraph


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

"""The rate limiter (``actors/scheduling/rate_limiter.py``) as Triton core's ``rate_limiter.cc`` behaves:
default copies are the most any instance needs, explicit ones refuse what can never run, the staged
instance with the lowest executions x priority goes next, and the head of the line is not passed."""

from __future__ import annotations

import gevent.event
import pytest

from triton_actor.actors.scheduling.rate_limiter import EVERY_DEVICE, GLOBAL, Needs, RateLimiter, Waiter
from triton_actor.errors import Code, TritonError


def _needs(*resources: tuple[str, int, int], priority: int = 1) -> Needs:
    return Needs(tuple(((name, device), count) for name, device, count in resources), priority)


def _one(limiter: RateLimiter, needs: Needs, name: str = "i") -> Waiter:
    return limiter.register([(needs, name)])[0]


def test_default_copies_are_the_most_any_instance_needs() -> None:
    limiter = RateLimiter()
    a = _one(limiter, _needs(("R1", 0, 4), ("R2", 0, 4)), "A")
    b = _one(limiter, _needs(("R2", 0, 5), ("R3", 0, 10)), "B")
    assert limiter.status()["resources"] == {"R1@0": [0, 4], "R2@0": [0, 5], "R3@0": [0, 10]}
    granted: list[str] = []
    assert limiter.ask(a, lambda: granted.append("A"))
    assert not limiter.ask(b, lambda: granted.append("B"))  # R2: 4 of 5 held
    assert limiter.status()["waiting"] == ["B"]
    limiter.give_back(a)
    assert granted == ["B"] and limiter.status()["resources"]["R2@0"] == [5, 5]


def test_explicit_copies_refuse_what_could_never_run() -> None:
    limiter = RateLimiter([("R1", EVERY_DEVICE, 10), ("R2", 0, 5)])
    _one(limiter, _needs(("R1", 1, 10), ("R2", 0, 5)))
    with pytest.raises(TritonError) as info:
        _one(limiter, _needs(("R2", 1, 1)))  # R2 given for device 0 only: none on device 1
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message == ('Resource count for "R2" is limited to 0 which will prevent scheduling of one or '
                                  "more model instances, the minimum required count is 1")
    assert limiter.status()["resources"] == {"R1@1": [0, 10], "R2@0": [0, 5]}  # the refused load left nothing


def test_a_global_resource_takes_its_count_from_any_device_spec() -> None:
    limiter = RateLimiter([("R3", EVERY_DEVICE, 2)])
    _one(limiter, _needs(("R3", GLOBAL, 2)))
    assert limiter.status()["resources"] == {"R3@global": [0, 2]}
    with pytest.raises(TritonError, match='Resource "R3" is present as both global and device-specific'):
        _one(limiter, _needs(("R3", 0, 1)))


def test_priority_two_runs_half_as_often_when_both_always_wait() -> None:
    limiter = RateLimiter()
    one = _one(limiter, _needs(("R", 0, 1), priority=1), "p1")
    two = _one(limiter, _needs(("R", 0, 1), priority=2), "p2")
    runs: list[str] = []
    holder: list[Waiter] = []

    def grant(waiter: Waiter, name: str) -> None:
        runs.append(name)
        holder.append(waiter)

    assert limiter.ask(one, lambda: None)
    runs.append("p1")
    holder.append(one)
    limiter.ask(two, lambda: grant(two, "p2"))
    while len(runs) < 300:
        done = holder.pop(0)
        # the instance that ran has more work: staged again before the line moves, as Triton does
        limiter.give_back(done, allocate=False)
        limiter.ask(done, lambda done=done: grant(done, "p1" if done is one else "p2"))
        if not holder:  # asked and got it at once
            grant(done, "p1" if done is one else "p2")
    assert runs.count("p1") == 200 and runs.count("p2") == 100


def test_the_head_of_the_line_is_not_passed() -> None:
    """Triton allocates the head of the line only: a small need behind a big one waits for it."""
    limiter = RateLimiter()
    small = _one(limiter, _needs(("R", 0, 1)), "small")
    big = _one(limiter, _needs(("R", 0, 2)), "big")
    other = _one(limiter, _needs(("R", 0, 1)), "other")
    order: list[str] = []
    assert limiter.ask(small, lambda: order.append("small"))
    assert not limiter.ask(big, lambda: order.append("big"))
    assert not limiter.ask(other, lambda: order.append("other"))  # 1 of 2 free, but big is first
    limiter.give_back(small)
    assert order == ["big"]
    limiter.give_back(big)
    assert order == ["big", "other"]


def test_withdrawn_and_unregistered_instances_leave_the_line() -> None:
    limiter = RateLimiter()
    a, b = limiter.register([(_needs(("R", 0, 1)), "a"), (_needs(("R", 0, 1)), "b")])
    c = _one(limiter, _needs(("R", 0, 1)), "c")
    got: list[str] = []
    assert limiter.ask(a, lambda: got.append("a"))
    limiter.ask(b, lambda: got.append("b"))
    limiter.ask(c, lambda: got.append("c"))
    limiter.withdraw(b)
    limiter.unregister([a])  # a's version unloads while it holds R: c goes next
    assert got == ["c"] and limiter.status()["waiting"] == []


class HeldElsewhere:
    """The host's units (``SharedUnits``) while another worker holds R, until :attr:`free`."""

    def __init__(self) -> None:
        self.free = False
        self.taken = 0
        self.turn_given_up = 0

    def take(self, resources: object, totals: object) -> str | None:
        if not self.free:
            return None
        self.taken += 1
        return "lease"

    def give(self, lease: str) -> None:
        self.taken -= 1

    def stop_waiting(self) -> None:
        self.turn_given_up += 1


def test_a_head_whose_units_another_worker_holds_waits_and_is_granted_once_they_are_free() -> None:
    units = HeldElsewhere()
    limiter = RateLimiter(shared=units)
    head = _one(limiter, _needs(("R", GLOBAL, 1)), "A")
    behind = _one(limiter, _needs(("S", GLOBAL, 1)), "B")
    granted = gevent.event.Event()
    assert not limiter.ask(head, granted.set)  # free here, held by another worker
    assert not limiter.ask(behind, lambda: None)  # the head of the line is not passed
    assert limiter.status()["waiting_for_host"] and limiter.status()["waiting"] == ["A", "B"]
    units.free = True  # the other worker gave R back: the limiter's next try takes it
    assert granted.wait(10)
    assert head.held and behind.held and units.taken == 2
    assert not limiter.status()["waiting_for_host"] and units.turn_given_up == 1
    limiter.give_back(head)
    limiter.give_back(behind)
    assert units.taken == 0 and head.lease is None

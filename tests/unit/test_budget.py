"""The request memory budget (frontends/budget.py): first come first served, one oversized request
alone, waits that run out or are killed give their place back."""

from __future__ import annotations

import gevent
import pytest

from triton_actor.frontends.budget import ByteBudget, with_room


def test_reservations_fit_the_limit_and_wait_in_line() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(60)
    assert not budget.try_reserve(50)
    order: list[str] = []
    big = gevent.spawn(lambda: budget.reserve(80, None) and order.append("80"))
    gevent.sleep(0)
    assert not budget.try_reserve(10), "a small request may not pass one waiting before it"
    assert budget.try_reserve(10, barge=True) and budget.used == 70  # unless it cannot wait
    budget.release(10)
    small = gevent.spawn(lambda: budget.reserve(10, None) and order.append("10"))
    gevent.sleep(0)
    budget.release(60)
    gevent.joinall([big, small], timeout=5)
    assert order == ["80", "10"] and budget.used == 90


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(1)
    assert not budget.try_reserve(500)
    budget.release(1)
    assert budget.try_reserve(500) and budget.used == 500
    assert not budget.try_reserve(1)
    budget.release(500)
    assert budget.used == 0


def test_a_wait_that_runs_out_gives_its_place_back() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(90)
    assert not budget.reserve(50, 0.01)
    assert budget.try_reserve(10) and budget.used == 100  # the line is empty again


@pytest.mark.parametrize("granted", [False, True])
def test_a_killed_wait_holds_nothing_it_was_not_told_it_has(granted: bool) -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(90)
    waiter = gevent.spawn(budget.reserve, 50, None)
    gevent.sleep(0)
    if granted:
        budget.release(90)  # granted just before the kill: reserve() still tells its caller so
    waiter.kill()
    if granted:
        assert waiter.value is True and budget.used == 50
    else:
        assert isinstance(waiter.value, gevent.GreenletExit) and budget.used == 90 and not budget._waiters
    assert budget.try_reserve(10)


def test_zero_is_no_bound() -> None:
    budget = ByteBudget(0)
    assert budget.try_reserve(10**12) and budget.try_reserve(10**12)


def test_with_room_reserves_what_arrived_and_as_much_again_up_to_256_kib() -> None:
    assert [with_room(n) for n in (0, 5, 100_000)] == [0, 10, 200_000]
    assert with_room(64 * 2**20) == 64 * 2**20 + 256 * 1024

"""The request memory budget (frontends/budget.py): first come first served, one oversized request
alone, waits that run out or are killed give their place back.

``gevent.sleep(0)`` is one turn of the hub, not a wait on time: the greenlets just spawned run until they
wait on the budget, in the order they were spawned."""

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
        assert isinstance(waiter.value, gevent.GreenletExit) and budget.used == 90 and not any(budget._lines)
    assert budget.try_reserve(10)


def test_zero_is_no_bound() -> None:
    budget = ByteBudget(0)
    assert budget.try_reserve(10**12) and budget.try_reserve(10**12)


def test_with_room_reserves_what_arrived_and_as_much_again_up_to_256_kib() -> None:
    assert [with_room(n) for n in (0, 5, 100_000)] == [0, 10, 200_000]
    assert with_room(64 * 2**20) == 64 * 2**20 + 256 * 1024


def test_pressed_while_someone_waits_or_was_refused_within_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the HTTP reaper presses bodies on (http1 press): a line, or a refusal (a gRPC message or a
    chunked body is refused, not queued) less than a second old; ``line_formed`` wakes the reaper."""
    clock = [1000.0]
    monkeypatch.setattr("triton_actor.frontends.budget.monotonic", lambda: clock[0])
    budget = ByteBudget(100)
    assert budget.try_reserve(90) and not budget.pressed and not budget.line_formed.is_set()
    waiter = gevent.spawn(budget.reserve, 50, None)
    gevent.sleep(0)
    assert budget.pressed and budget.line_formed.is_set()
    budget.line_formed.clear()
    budget.release(90)
    assert waiter.get(timeout=5) is True
    clock[0] += 1.0  # its own refusal (it did not fit before it queued) is a second old
    assert not budget.pressed
    assert not budget.try_reserve(60, barge=True)  # refused for room
    assert budget.pressed and budget.line_formed.is_set()
    clock[0] += 1.0
    assert not budget.pressed


def test_the_line_is_served_earliest_body_deadline_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter's place is when it came plus its size over the minimum rate: a small request goes
    ahead of big ones that came before it (silent 64 MiB reservations cannot keep a line ahead of
    everyone), but not ahead of a big one whose deadline came before it did; the head takes the next
    bytes freed (nothing smaller passes it unless it comes before it)."""
    clock = [1000.0]
    monkeypatch.setattr("triton_actor.frontends.budget.monotonic", lambda: clock[0])
    budget = ByteBudget(100, rate=10)  # 10 bytes/s: 80 bytes count as 8 s later
    assert budget.try_reserve(100)
    order: list[str] = []

    def wait(n: int, name: str) -> gevent.Greenlet:
        g = gevent.spawn(lambda: budget.reserve(n, None) and order.append(name))
        gevent.sleep(0)
        return g

    waiters = [wait(80, "big"), wait(90, "bigger")]  # places 1008 and 1009
    clock[0] += 5
    waiters.append(wait(10, "small"))  # place 1006: before both
    assert not budget.try_reserve(30), "1008 comes before 1008: it waits behind the first big one"
    budget.release(100)
    gevent.joinall(waiters[::2], timeout=5)
    assert order == ["small", "big"] and budget.used == 90  # "bigger" does not fit yet
    clock[0] += 10
    waiters.append(wait(5, "late"))  # place 1015.5: after "bigger" (1009), which is the head
    budget.release(70)  # 20 held: "late" would fit, "bigger" not
    gevent.sleep(0)
    assert order == ["small", "big"], "nothing passes the head that does not come before it"
    budget.release(10)
    gevent.sleep(0)
    assert order == ["small", "big", "bigger"] and budget.used == 100
    budget.release(10)
    gevent.joinall(waiters, timeout=5)
    assert order == ["small", "big", "bigger", "late"] and budget.used == 95


def test_without_a_rate_the_line_is_first_come_first_served() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(100)
    order: list[int] = []
    waiters = [gevent.spawn(lambda n=n: budget.reserve(n, None) and order.append(n)) for n in (60, 10, 30)]
    gevent.sleep(0)
    budget.release(100)
    gevent.joinall(waiters, timeout=5)
    assert order == [60, 10, 30]


def test_big_bodies_never_keep_a_small_request_waiting() -> None:
    """The last 1/16 of the budget is the small requests' lane (at most 1/1024 of it, at least 64 KiB),
    and they have a line of their own: with big requests holding all they may and more waiting, a
    small one is served at once; it waits only behind small ones, and a big one takes the bytes freed."""
    mib = 2**20
    budget = ByteBudget(16 * mib)  # small: up to 64 KiB; the lane: the last 1 MiB
    assert budget.try_reserve(15 * mib) and not budget.try_reserve(mib), "a big one may not take the lane"
    big = gevent.spawn(budget.reserve, mib, None)
    gevent.sleep(0)
    assert budget.try_reserve(1024), "a small one passes the big line"
    for _ in range(15):
        assert budget.try_reserve(64 * 1024)
    assert budget.try_reserve(16 * mib - budget.used) and budget.used == budget.limit  # the lane's last bytes
    small = gevent.spawn(budget.reserve, 1024, None)
    gevent.sleep(0)
    assert not budget.try_reserve(1), "a small one waits behind the small line"
    budget.release(15 * mib)
    assert small.get(timeout=5) is True and big.get(timeout=5) is True
    assert budget.used == mib + 1024 + mib

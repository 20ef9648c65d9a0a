"""Shutdown's drain wait (frontends/drain.py), shared by the HTTP and gRPC front ends: waiters at the same
time all wake when the count reaches zero, and a waiter set before does not answer a later wait."""

from __future__ import annotations

import gevent
import gevent.event

from triton_actor.frontends.drain import wait_until_idle


class _Holder:
    def __init__(self) -> None:
        self.idle_waiter: gevent.event.Event | None = None


def test_idle_now_is_answered_without_a_waiter() -> None:
    holder = _Holder()
    assert wait_until_idle(holder, 0, 0)
    assert holder.idle_waiter is None


def test_waiters_at_the_same_time_all_wake_at_zero() -> None:
    holder = _Holder()
    waits = [gevent.spawn(wait_until_idle, holder, 1, 30) for _ in range(2)]
    gevent.idle()  # both wait now
    assert holder.idle_waiter is not None
    holder.idle_waiter.set()  # what a driver does when its count reaches 0
    assert [w.get(timeout=30) for w in waits] == [True, True]  # (before: the first one's Event was replaced)


def test_a_spent_waiter_does_not_answer_a_later_wait() -> None:
    holder = _Holder()
    first = gevent.spawn(wait_until_idle, holder, 1, 30)
    gevent.idle()
    holder.idle_waiter.set()
    assert first.get(timeout=30)
    assert not wait_until_idle(holder, 1, 0)  # busy again: a new Event, not the one set before

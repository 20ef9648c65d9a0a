"""WakeTimer (``triton_actor/runtime/wake_timer.py``): one gevent loop timer at the earliest deadline asked
for, telling its owner :class:`Wake`. The tests wait on the wakes themselves (a queue with a timeout),
never on a sleep; a wake that must not come is checked after a later one that must."""

from __future__ import annotations

import gevent
import gevent.event
import gevent.queue
import pytest

from triton_actor.errors import TritonError
from triton_actor.runtime.wake_timer import Wake, WakeTimer

MS = 1_000_000
WAIT = 5.0


def _owner() -> tuple[WakeTimer, gevent.queue.Queue]:
    told: gevent.queue.Queue = gevent.queue.Queue()
    return WakeTimer(told.put), told


def test_arm_tells_one_wake_and_woke_disarms() -> None:
    timer, told = _owner()
    assert not timer.armed
    timer.arm(0, 1 * MS)
    assert timer.armed
    wake = told.get(timeout=WAIT)
    assert isinstance(wake, Wake)
    timer.woke(wake)
    assert not timer.armed and told.empty()


def test_a_later_deadline_keeps_the_armed_timer() -> None:
    timer, told = _owner()
    timer.arm(0, 1 * MS)
    timer.arm(0, 3600_000 * MS)  # covered: the owner's policy is polled at the first wake anyway
    timer.woke(told.get(timeout=WAIT))
    assert not timer.armed  # the hour-long timer was never armed


def test_an_earlier_deadline_replaces_the_armed_timer() -> None:
    timer, told = _owner()
    timer.arm(0, 3600_000 * MS)
    timer.arm(0, 1 * MS)
    wake = told.get(timeout=WAIT)
    timer.woke(wake)
    assert not timer.armed  # the wake came from the replacement, the one now armed


def test_a_wake_from_a_replaced_timer_keeps_the_newer_one() -> None:
    timer, told = _owner()
    timer.arm(0, 1 * MS)
    stale = told.get(timeout=WAIT)  # fired, not yet handled by the owner ...
    timer.arm(10 * MS, 1 * MS)  # ... which meanwhile armed again (the fired timer still counted as armed)
    timer.woke(Wake(object()))  # a wake from some other timer changes nothing
    assert timer.armed
    timer.woke(stale)
    assert not timer.armed  # the fired timer was the armed one: later deadline, nothing newer armed


def test_stop_cancels_the_armed_timer() -> None:
    timer, told = _owner()
    timer.arm(0, 1 * MS)
    timer.stop()
    assert not timer.armed
    later, later_told = _owner()
    later.arm(0, 20 * MS)
    later_told.get(timeout=WAIT)  # a timer armed after the stopped one has fired ...
    assert told.empty()  # ... and the stopped one never did


def test_a_stopped_owner_drops_the_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    hub_errors: list[object] = []
    monkeypatch.setattr(gevent.get_hub(), "handle_error", lambda *args: hub_errors.append(args))
    told = gevent.event.Event()

    def stopped(msg: object) -> None:  # a stopped actor's tell
        told.set()
        raise TritonError.unavailable("actor 'x' is stopped")

    WakeTimer(stopped).arm(0, 1 * MS)
    assert told.wait(WAIT)  # resumes after the timer's callback returned
    assert hub_errors == []  # UNAVAILABLE was swallowed, not left to the hub


@pytest.mark.parametrize("wait_ns", [0, 1])
def test_zero_and_tiny_waits_fire(wait_ns: int) -> None:
    timer, told = _owner()
    timer.arm(5 * MS, wait_ns)
    timer.woke(told.get(timeout=WAIT))
    assert not timer.armed

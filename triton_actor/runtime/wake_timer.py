"""WakeTimer: the one wake-up timer of an actor whose policy has deadlines (a batcher's delay, a queue
timeout, a sequence's idle timeout).

The actor asks for a wake-up at each deadline its policy reports (:meth:`WakeTimer.arm`); the timer
keeps only the earliest one: a later deadline is covered by the wake-up already armed (the policy is
polled again then and reports what is left), an earlier one replaces it. When it fires, the actor is
told :class:`Wake`, so the policy runs in the actor's own handler, never in the timer's callback.

Owner: one actor; its handlers call :meth:`arm`, :meth:`woke` and :meth:`stop`. The gevent loop timer's
callback (:meth:`_fire`) runs in the hub and only tells the actor. Failure: a wake-up for an actor
stopped meanwhile is dropped (its ``tell`` raises UNAVAILABLE); :meth:`stop` in ``on_stop`` cancels
the pending one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent

from ..errors import TritonError


@dataclass(frozen=True, slots=True)
class Wake:
    """The timer fired: a deadline of the actor's policy is due."""

    timer: Any


class WakeTimer:
    """At most one armed gevent loop timer, at the earliest deadline asked for; ``tell`` is the owning
    actor's ``ref.tell``."""

    __slots__ = ("_tell", "_timer", "_at")

    def __init__(self, tell: Callable[[object], None]) -> None:
        self._tell = tell
        self._timer: Any = None
        self._at = 0

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self, now: int, wait_ns: int) -> None:
        """Wake the actor in ``wait_ns`` (clock ``now``, ns) unless the armed timer fires by then."""
        at = now + wait_ns
        if self._timer is not None:
            if self._at <= at:
                return
            self._timer.stop()
        self._at = at
        timer = self._timer = gevent.get_hub().loop.timer(wait_ns / 1e9)
        timer.start(self._fire, timer)

    def woke(self, msg: Wake) -> None:
        """In the actor's ``on_Wake``: the timer that fired is spent (a wake from a timer replaced
        meanwhile keeps the newer one armed)."""
        if msg.timer is self._timer:
            self._timer = None

    def stop(self) -> None:
        """Cancel the armed timer (the actor stops)."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _fire(self, timer: Any) -> None:
        try:
            self._tell(Wake(timer))
        except TritonError:  # the actor stopped meanwhile
            pass

"""Shutdown's drain of a front end: wait until its running count (HTTP requests, gRPC calls) is back to
zero, at no cost per request. The driver keeps the count in line and sets the holder's ``idle_waiter``
when the count it left is 0; the Event exists only while something waits. Owner: the front ends."""

from __future__ import annotations

from typing import Protocol

import gevent.event


class _Holder(Protocol):
    idle_waiter: gevent.event.Event | None


def wait_until_idle(holder: _Holder, busy: int, timeout: float | None) -> bool:
    """Wait until ``holder``'s count, ``busy`` now, is 0; True when it was in time. Waiters at the same time
    share one Event; one set before is spent (requests ran again since) and replaced."""
    if not busy:
        return True
    waiter = holder.idle_waiter
    if waiter is None or waiter.is_set():
        waiter = holder.idle_waiter = gevent.event.Event()
    return waiter.wait(timeout)

"""How a producer waits for room in a :class:`~.response_channel.BoundedResponseChannel`.

A producer on a native thread without a gevent hub blocks on a lock of the OS (:class:`LockWaiter`); one
on a thread with a hub of its own (a model that started "threads" there), or a greenlet of the main hub
other than the hub itself, waits only as its greenlet (:class:`HubWaiter`). The channel registers a
waiter in its list under its lock and wakes it under that lock (``wake``), after taking it out of the
list; so a waiter whose wait timed out knows under the lock whether it was woken meanwhile (it is no
longer in the list). A timed-out waiter stays registered: the channel decides whether to wait again.
"""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event

from .bridge import this_thread_hub
from .threads import native_lock
from .threads import native_thread_id as _get_ident


class LockWaiter:
    """A producer on a native thread without a gevent hub: it blocks on a lock of the OS."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = native_lock()
        self._lock.acquire()

    def wake(self) -> None:
        self._lock.release()

    def wait(self, guard: Any, waiters: list[Any], timeout: float | None = None) -> bool:
        """Whether it was woken (False: ``timeout`` s passed and it is still registered)."""
        if self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return True
        with guard:
            if self in waiters:
                return False
        self._lock.acquire()  # woken between the timeout and the guard: take the wake-up's release
        return True

    def discard(self) -> None:
        pass


class HubWaiter:
    """A producer greenlet on a thread with a gevent hub: only it waits, woken through a watcher of its
    own hub."""

    __slots__ = ("_event", "_watcher")

    def __init__(self, hub: Any) -> None:
        self._event = gevent.event.Event()
        self._watcher = hub.loop.async_()
        self._watcher.start(self._event.set)

    def wake(self) -> None:
        self._watcher.send()  # any thread, under the channel's lock

    def wait(self, guard: Any, waiters: list[Any], timeout: float | None = None) -> bool:
        """Whether it was woken (False: ``timeout`` s passed and it is still registered)."""
        woken = True
        try:
            if self._event.wait(timeout):
                return True
            with guard:
                woken = self not in waiters  # else a wake-up is on its way: done all the same
            return woken
        finally:  # woken, or killed while waiting (GreenletExit): out of the list, then the watcher closes
            if woken:
                with guard:  # a wake() under way finishes first
                    if self in waiters:
                        waiters.remove(self)
                    self._watcher.close()

    def discard(self) -> None:
        self._watcher.close()


def waiter(hub_thread: int) -> LockWaiter | HubWaiter | None:
    """How the calling producer waits; None on the hub greenlet of the hub thread (it never waits)."""
    hub = this_thread_hub()
    if hub is None:
        return LockWaiter()
    if gevent.getcurrent() is hub:
        return None if _get_ident() == hub_thread else LockWaiter()
    return HubWaiter(hub)

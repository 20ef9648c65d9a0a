"""The way back: a native thread runs a function in a greenlet on the hub and waits for its result.

This is :mod:`.bridge`'s other direction. A :class:`HubPort` is created in the hub thread; any
native thread calls :meth:`HubPort.call`. The call is appended to a deque and the hub is woken
through one ``loop.async_()`` watcher (wake-ups coalesce under load); the hub spawns a greenlet per
call, and the caller blocks on an original (unpatched) ``_thread`` lock, which the greenlet
releases. :meth:`HubPort.post` is the fire-and-forget variant whose result goes to a callback that
runs in the hub.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
from gevent import monkey

T = TypeVar("T")
_allocate_lock = monkey.get_original("_thread", "allocate_lock")


class HubPort:
    """Calls from native threads into hub greenlets. Create, use ``close`` from the hub thread."""

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[Callable[..., Any], tuple[Any, ...], Any]] = collections.deque()
        self._wake = gevent.get_hub().loop.async_()
        self._wake.start(self._drain)
        self._closed = False

    # -- native threads -------------------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a new hub greenlet; block this native thread until it returns or raises."""
        lock = _allocate_lock()
        lock.acquire()
        box: list[Any] = [lock, None, None]
        self._pending.append((fn, args, box))
        self._wake.send()
        lock.acquire()
        if box[2] is not None:
            raise box[2]
        return box[1]

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in a new hub greenlet without waiting; errors must be handled by ``fn``."""
        self._pending.append((fn, args, None))
        self._wake.send()

    # -- hub thread -----------------------------------------------------------------------------
    def _drain(self) -> None:
        pending = self._pending
        spawn = gevent.spawn
        while pending:
            fn, args, box = pending.popleft()
            spawn(_run, fn, args, box)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._drain()
            self._wake.close()


def _run(fn: Callable[..., Any], args: tuple[Any, ...], box: list[Any] | None) -> None:
    if box is None:
        fn(*args)
        return
    try:
        box[1] = fn(*args)
    except BaseException as e:  # noqa: BLE001 - handed to the waiting native thread
        box[2] = e
    finally:
        box[0].release()

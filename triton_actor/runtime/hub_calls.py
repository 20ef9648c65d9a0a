"""Calls from native threads to the hub and their answers: what a Python model's calls into the server
(BLS, model control: plane/calls_from_models.py) travel through.

:class:`HubCalls` runs a function in a greenlet on the hub for any thread; :class:`ThreadInbox` carries
items from the hub to one consumer thread (the caller, waiting); :func:`wait_on_hub` is the two together.
Owner: the server's :class:`~..plane.calls_from_models.ServerCalls` (one :class:`HubCalls`), created and
closed in the hub thread. Split out of :mod:`.bridge` (which owns the instances' threads) at its size cap.
"""

from __future__ import annotations

import _queue
import collections
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
import gevent.event
from gevent._hub_local import get_hub_if_exists

from .bridge import HubSignal

S = TypeVar("S")


class ThreadInbox:
    """Items from the hub to one consumer on a native thread other than the hub's.

    Create it on the consumer's thread. ``put`` may be called from any thread (the hub, usually);
    ``get`` blocks the consumer: on a C queue while that thread has no gevent hub, or cooperatively
    in its own hub when it has one (its greenlets, e.g. a decoupled model's response "threads", keep
    running while it waits). ``close`` (consumer side) releases the watcher.
    """

    __slots__ = ("_queue", "_items", "_event", "_watcher")

    def __init__(self) -> None:
        hub = get_hub_if_exists()
        self._queue: _queue.SimpleQueue | None = None
        self._watcher: Any = None
        if hub is None:
            self._queue = _queue.SimpleQueue()
        else:
            self._items: collections.deque[Any] = collections.deque()
            self._event = gevent.event.Event()
            self._watcher = hub.loop.async_()
            self._watcher.start(self._event.set)

    def put(self, item: Any) -> None:
        """Any thread: hand ``item`` to the consumer (dropped once the consumer closed it)."""
        if self._queue is not None:
            self._queue.put(item)
            return
        self._items.append(item)
        watcher = self._watcher
        if watcher is not None:
            try:
                watcher.send()
            except Exception:  # noqa: BLE001 - closed meanwhile by the consumer: nobody reads any more
                pass

    def get(self) -> Any:
        """Consumer thread: the next item (blocks until there is one)."""
        if self._queue is not None:
            return self._queue.get()
        items, event = self._items, self._event
        while not items:
            event.clear()
            if items:
                break
            event.wait()
        return items.popleft()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None


class HubCalls:
    """Runs functions on the hub for native threads: ``submit(fn, args, done)`` from any thread runs
    ``fn(*args)`` in a new greenlet on the hub, then ``done(ok, value)`` there (it must be thread-safe
    towards the caller: put into a :class:`ThreadInbox`, ``loop.call_soon_threadsafe``...).

    Owner: the server, created and closed in the hub thread. Requests coalesce into one wake-up of
    the hub's watcher. Failure: whatever ``fn`` raises goes to ``done`` as ``(False, error)``.
    """

    def __init__(self) -> None:
        self._calls: collections.deque[tuple[Callable[..., Any], tuple[Any, ...], Callable[[bool, Any], None]]] = (
            collections.deque())
        self._signal = HubSignal(self._drain)

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Callable[[bool, Any], None]) -> None:
        """Any thread."""
        self._calls.append((fn, args, done))
        self._signal.send()

    def _drain(self) -> None:
        calls = self._calls
        while calls:
            gevent.spawn(_run_call, *calls.popleft())

    def close(self) -> None:
        self._signal.close()


def _run_call(fn: Callable[..., Any], args: tuple[Any, ...], done: Callable[[bool, Any], None]) -> None:
    """Hub greenlet: one call submitted through :class:`HubCalls`."""
    try:
        value = fn(*args)
    except BaseException as e:  # noqa: BLE001 - delivered to the calling thread
        done(False, e)
        return
    done(True, value)


def wait_on_hub(calls: HubCalls, fn: Callable[..., S], *args: Any) -> S:
    """Native thread (not the hub's): run ``fn(*args)`` on the hub and wait for its value or error."""
    inbox = ThreadInbox()
    try:
        calls.submit(fn, args, lambda ok, value: inbox.put((ok, value)))
        ok, value = inbox.get()
    finally:
        inbox.close()
    if not ok:
        try:
            raise value
        finally:
            value = None  # the raised error's traceback holds this frame: no cycle through its local
    return value

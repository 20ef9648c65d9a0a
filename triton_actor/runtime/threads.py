"""Native OS threads and what they share: the only place outside the bridge that starts or locks them.

Everything here is built on the *original* ``_thread`` functions (``gevent.monkey.get_original``), so it
is native whatever the patching: the server leaves ``threading`` native, the test process patches it,
and both get the same locks and threads from here. Nothing here waits on the hub or touches gevent
objects; a native thread reaches the hub through :class:`~.bridge.HubSignal` or a :class:`~.bridge.NativeWorker`.

* :func:`native_lock`, :func:`native_rlock`, :class:`NativeCondition`, :class:`NativeEvent`: state shared
  by native threads. Held briefly: the hub may take a lock too, never while the holder waits on I/O.
* :func:`start_native_thread`: a thread of its own for work that blocks (a BLS call served for a
  model's process, a reader of a pipe).
* :class:`SerialWriter`: one native thread writing one sink (a pipe to a model's process) in the
  order the items were submitted, from any thread, without the submitter ever waiting for the sink.
"""

from __future__ import annotations

import _queue
import collections
import logging
from collections.abc import Callable
from typing import Any

from gevent import monkey

log = logging.getLogger(__name__)
_start_native = monkey.get_original("_thread", "start_new_thread")
_allocate_lock = monkey.get_original("_thread", "allocate_lock")
_RLock = monkey.get_original("_thread", "RLock")
native_thread_id: Callable[[], int] = monkey.get_original("_thread", "get_ident")
native_sleep: Callable[[float], None] = monkey.get_original("time", "sleep")  # ``time`` is patched: its sleep would start a hub


def native_lock() -> Any:
    """A lock of the OS thread library, not gevent's: for state shared with native threads (held briefly)."""
    return _allocate_lock()


def native_rlock() -> Any:
    """A re-entrant lock of the OS thread library."""
    return _RLock()


def start_native_thread(fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` on a new native OS thread (not a greenlet, whatever the patching). It must
    not touch the hub's gevent objects; a :class:`~.bridge.HubSignal` is how it reaches the hub."""
    _start_native(fn, args)


class NativeCondition:
    """``threading.Condition`` on native locks (``with``, :meth:`wait`, :meth:`notify_all`)."""

    __slots__ = ("_lock", "_waiters")

    def __init__(self) -> None:
        self._lock = _allocate_lock()
        self._waiters: collections.deque[Any] = collections.deque()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Holding the lock: release it until notified (or ``timeout`` s passed), then take it again.
        False when it timed out."""
        waiter = _allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        woken = False
        try:
            woken = waiter.acquire(True, -1 if timeout is None else max(0.0, timeout))
        finally:
            self._lock.acquire()
            if not woken:
                try:
                    self._waiters.remove(waiter)
                except ValueError:  # notified between the timeout and taking the lock again
                    woken = True
        return woken

    def notify_all(self) -> None:
        """Holding the lock: wake every waiter."""
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            waiter.release()


class NativeEvent:
    """``threading.Event`` on native locks: :meth:`set`, :meth:`is_set`, :meth:`wait`."""

    __slots__ = ("_cond", "_flag")

    def __init__(self) -> None:
        self._cond = NativeCondition()
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if ``timeout`` s passed first."""
        with self._cond:
            if not self._flag:
                self._cond.wait(timeout)
            return self._flag


_STOP = object()


class SerialWriter:
    """One native thread that calls ``write(item)`` for every item submitted, in submission order.

    :meth:`submit` may be called from any thread, the hub's included: it queues and returns, whatever
    the sink is doing (a full pipe waits in the writer's thread, never in the submitter's). Items
    submitted by one thread are written in that thread's order; items of several threads in the order
    their ``submit`` calls ran. :meth:`close` (any thread, never waits) lets the writer write what was
    submitted before it, then call ``close()`` and end (:attr:`stopped`). Failure: the first ``write``
    that raises ``OSError`` (the reader is gone) is kept in :attr:`broken`; what is queued after it is
    dropped, and ``submit`` raises ``BrokenPipeError`` from then on, as it does once closed. Any other
    error of a ``write`` is logged and that item dropped.
    """

    __slots__ = ("name", "_write", "_close", "_queue", "_lock", "_closed", "broken", "stopped")

    def __init__(self, name: str, write: Callable[[Any], None], close: Callable[[], None]) -> None:
        self.name = name
        self._write = write
        self._close = close
        self._queue: _queue.SimpleQueue = _queue.SimpleQueue()
        self._lock = _allocate_lock()  # an item is queued only before the close's stop
        self._closed = False
        self.broken: OSError | None = None  # written by the writer's thread only
        self.stopped = NativeEvent()
        _start_native(self._run, ())

    def submit(self, item: Any) -> None:
        """Any thread, never waits for the sink: ``item`` is written after every item submitted before it.
        Raises ``BrokenPipeError`` once closed, or once a write failed."""
        with self._lock:
            if self._closed or self.broken is not None:
                raise BrokenPipeError(f"{self.name}: closed" if self._closed else f"{self.name}: {self.broken}")
            self._queue.put(item)

    def close(self) -> None:
        """Any thread, never waits: write what was submitted, then close the sink and end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)

    def _run(self) -> None:
        """The writer's native thread."""
        try:
            while (item := self._queue.get()) is not _STOP:
                if self.broken is not None:
                    continue  # the reader is gone: nothing reaches it any more
                try:
                    self._write(item)
                except OSError as e:
                    self.broken = e
                except Exception:  # a bug of ours (an item that cannot be encoded): the others go on
                    log.exception("%s: writing %r failed", self.name, type(item).__name__)
            try:
                self._close()
            except OSError:
                pass
        finally:
            self.stopped.set()

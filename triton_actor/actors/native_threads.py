"""Native OS threads for libraries that must not run on the gevent hub (grpcio's sync server).

After ``monkey.patch_all()`` the ``threading`` module makes greenlets and gevent locks, and gevent
locks must not be shared between OS threads. :func:`native_threading` returns a private copy of the
``threading`` module executed against the *original* ``_thread`` primitives, so its ``Thread``,
``Lock``, ``RLock``, ``Condition`` and ``Event`` are real OS-level ones; the process-wide
``threading`` module stays patched for everybody else.

:class:`NativeExecutor` is the small ``concurrent.futures``-like pool grpcio's server submits its
handlers to (the stdlib pool would use the patched ``threading`` and ``queue``). It grows one
thread at a time when no thread is idle, because a streaming RPC holds its thread for its lifetime.

Nothing here touches gevent objects; :mod:`.hub_port` is how these threads reach the hub.
"""

from __future__ import annotations

import _queue
import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

from gevent import monkey

log = logging.getLogger(__name__)
_module: types.ModuleType | None = None


def _original_thread_module() -> types.ModuleType:
    """A stand-in ``_thread`` module whose functions are the unpatched originals."""
    patched = sys.modules["_thread"]
    mod = types.ModuleType("_thread")
    mod.__dict__.update(patched.__dict__)
    for name in monkey.saved.get("_thread", {}):
        setattr(mod, name, monkey.get_original("_thread", name))
    return mod


def native_threading() -> types.ModuleType:
    """The private, unpatched copy of ``threading`` (built once; idempotent)."""
    global _module
    if _module is not None:
        return _module
    spec = importlib.util.find_spec("threading")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    saved = sys.modules["_thread"]
    sys.modules["_thread"] = _original_thread_module()
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules["_thread"] = saved
    _module = mod
    return mod


class NativeFuture:
    """Just what grpcio's server uses of a future: ``add_done_callback`` (thread-safe)."""

    __slots__ = ("_lock", "_callbacks", "_done")

    def __init__(self) -> None:
        self._lock = native_threading().Lock()
        self._callbacks: list[Callable[[NativeFuture], None]] = []
        self._done = False

    def add_done_callback(self, fn: Callable[[NativeFuture], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def done(self) -> bool:
        return self._done

    def _finish(self) -> None:
        with self._lock:
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("future callback failed")


class NativeExecutor:
    """A growing pool of native threads (at most ``max_workers``) fed through a C ``SimpleQueue``.

    ``_idle`` counts threads waiting on the queue and ``_queued`` the tasks nobody took yet; a
    submit starts a thread only when the queued tasks outnumber the waiting threads.
    """

    def __init__(self, name: str, max_workers: int = 1024) -> None:
        self.name = name
        self.max_workers = max_workers
        self._queue: _queue.SimpleQueue = _queue.SimpleQueue()
        self._lock = native_threading().Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._shutdown = False

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NativeFuture:
        """Any thread: queue ``fn(*args, **kwargs)``; start a thread when none is waiting for it."""
        future = NativeFuture()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"executor {self.name} is shut down")
            self._queued += 1
            grow = self._queued > self._idle and self._threads < self.max_workers
            if grow:
                self._threads += 1
        self._queue.put((fn, args, kwargs, future))
        if grow:
            native_threading().Thread(target=self._work, name=f"{self.name}-{self._threads}", daemon=True).start()
        return future

    def _work(self) -> None:
        get, lock = self._queue.get, self._lock
        while True:
            with lock:
                self._idle += 1
            item = get()
            with lock:
                self._idle -= 1
                if item is not None:
                    self._queued -= 1
            if item is None:
                break
            fn, args, kwargs, future = item
            try:
                fn(*args, **kwargs)
            except BaseException:
                log.exception("native executor task failed")
            future._finish()
        with lock:
            self._threads -= 1

    def shutdown(self, wait: bool = False) -> None:
        """Stop the threads once the queued work is done (``wait`` is accepted and ignored)."""
        with self._lock:
            self._shutdown = True
            count = self._threads
        for _ in range(count):
            self._queue.put(None)

"""An asyncio event loop running forever on a native thread of its own: a Python model's loop.

Triton's python backend stub creates one loop per model instance the first time ``execute`` (or
``initialize``) returns a coroutine, runs it forever on a daemon thread, and hands every later
coroutine to it (``pb_stub.cc``: ``GetAsyncEventLoop`` /
``RunCoroutine``). So tasks a model creates keep running after ``execute`` returned, and a decoupled
model's coroutine ``execute`` runs in the background while the instance takes the next batch.

Owner: the model instance that made it (its thread submits, :meth:`close` stops it). Threads: the
loop's own native thread runs the coroutines; :meth:`wait` blocks the caller on a native lock (never
on the hub). Failure: what a coroutine raises is what :meth:`wait` raises, or what ``done`` receives.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

from .bridge import act_for, current_worker
from .threads import NativeEvent, start_native_thread

CLOSE_WAIT_S = 10.0


class LoopThread:
    """``submit(coro)`` / ``wait(coro)`` on a loop that runs until :meth:`close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._worker = current_worker()  # the instance's, when made on its thread
        self._stopped = NativeEvent()
        # The tasks in flight, held until they end (Triton's stub keeps ``background_futures_``): the
        # loop holds a waiting task only weakly, and a task waiting on a future nobody else holds is a
        # cycle the garbage collector frees mid-run ("Task was destroyed but it is pending!").
        self._running: set[asyncio.Task[Any]] = set()  # the loop's thread only
        start_native_thread(self._run)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        act_for(self._worker)
        try:
            self.loop.run_forever()
        finally:
            act_for(None)
            self._stopped.set()

    def submit(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context | None = None,
               done: Callable[[asyncio.Task[Any]], None] | None = None) -> None:
        """Any thread: schedule ``coro`` (run in a copy of ``context``); ``done(task)`` runs on the
        loop's thread when it ends. No ``concurrent.futures``: where ``threading`` is patched its
        condition is gevent's, which a native thread cannot wait on."""
        wrapped = _in_context(coro, context) if context is not None else coro

        def start() -> None:  # the loop's thread
            task = self.loop.create_task(wrapped)
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            if done is not None:
                task.add_done_callback(done)

        self.loop.call_soon_threadsafe(start)

    def wait(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context | None = None) -> Any:
        """Run ``coro`` on the loop and block this (native) thread until it ends; its result or error."""
        finished = NativeEvent()
        ended: list[asyncio.Task[Any]] = []

        def done(task: asyncio.Task[Any]) -> None:
            ended.append(task)
            finished.set()

        self.submit(coro, context, done)
        finished.wait()
        return ended[0].result()

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Stop the loop (pending tasks are dropped, as Triton's stub stops it) and close it. A loop
        still blocked in model code after ``timeout`` s is left to end by itself (never closed while running)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._stopped.wait(timeout):
            self.loop.close()


async def _in_context(coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> Any:
    """The task runs in its own copy of the loop thread's context: carry over the caller's variables
    (which server's hooks a model's call reaches, ``triton_python_backend_utils.serving``)."""
    for var, value in context.items():
        var.set(value)
    return await coro

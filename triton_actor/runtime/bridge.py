"""The thread bridge: the only place native OS threads meet the gevent hub.

Each :class:`NativeWorker` owns exactly one native thread (:func:`.threads.start_native_thread`: the *original*
``_thread.start_new_thread`` — after monkey-patching ``threading.Thread`` would be a greenlet).
Work goes in through a C ``_queue.SimpleQueue`` (untouched by patching); results come back through a
deque plus one started ``loop.async_()`` watcher, whose callback completes the :class:`Reply` objects
in the hub thread. Wake-ups coalesce under load, and the active watcher keeps the loop alive while
work is pending (completing an AsyncResult from a foreign thread raises LoopExit otherwise).
"""

from __future__ import annotations

import _queue
import collections
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import gevent
import gevent.event
from gevent._hub_local import get_hub_if_exists

from .kernel import Reply
from .threads import native_thread_id as _get_ident
from .threads import start_native_thread

_thread_ns = time.thread_time_ns
_perf_ns = time.perf_counter_ns

log = logging.getLogger(__name__)
S = TypeVar("S")
_workers: dict[int, NativeWorker[Any]] = {}  # native thread id → its worker (written by that thread)
# a Python model's asyncio loop thread → the worker of the instance it runs coroutines for (loop_thread.py)
_acting: dict[int, NativeWorker[Any]] = {}
MAX_INTERRUPTIONS = 100  # system errors thrown into an idle worker in a row before it counts as dead


def contained(error: BaseException, what: str) -> BaseException:
    """An error from model code on a native thread, safe to raise in a hub greenlet: an Exception as
    it is; any other BaseException (SystemExit, KeyboardInterrupt, one of the model's own) wrapped in
    INTERNAL, since gevent's hub would re-raise it in the main greenlet and end the server."""
    if isinstance(error, Exception):
        return error
    from ..errors import TritonError

    return TritonError.internal(f"{what}: {error!r}")


class NativeWorker(Generic[S]):
    """A native thread that builds a state with ``setup()`` and then runs ``fn(state, *args)`` calls.

    Create and use it from the hub thread. ``setup`` and the submitted functions run in the native
    thread: they must be compute only (no gevent objects). ``teardown(state)`` runs there on close.
    """

    def __init__(
        self,
        name: str,
        setup: Callable[[], S],
        teardown: Callable[[S], None] | None = None,
    ) -> None:
        self.name = name
        self._inbox: _queue.SimpleQueue = _queue.SimpleQueue()
        self._done: collections.deque[tuple[Any, bool, Any]] = collections.deque()
        self._wake = gevent.get_hub().loop.async_()
        self._wake.start(self._drain)
        self.ready: Reply[bool] = Reply()
        self.stopped: Reply[bool] = Reply()
        self.thread_id: int | None = None
        self._closed = False
        self._hub: Any = None  # the native thread's own gevent hub, once model code created one
        # True from the moment code on this thread (setup, or any submitted call) created a gevent hub
        # here: it started a "thread" (a greenlet), slept, or waited on a patched lock or queue, so it
        # may own objects that only this thread's hub can wake. Written by the native thread before
        # the reply that follows it is posted; read in the hub. Never goes back to False.
        self.used_hub = False
        self._idle_wake: Any = None
        self._idle_event: Any = None
        self._hub_waiting = False
        # True once code on this thread called into the server (BLS, model control): such a call
        # waits for the hub, so the model must never be promoted to run on the hub itself (see
        # actors/scheduling/instance.py). Written by the native thread, read by the hub; never goes back.
        self.calls_server = False
        self.busy = False  # the native thread is running a submitted call (read by the BLS wait graph)
        self.tag: Any = None  # what the owner says this worker serves, e.g. (model, version)
        # why the thread's loop ended unexpectedly (None: it did not); written by the native thread
        # before ``stopped`` is posted, read in the hub after
        self.died: BaseException | None = None
        self._current: Any = None  # the work item the native thread is running
        self.stopped.link(self._fail_unread)
        start_native_thread(self._run, setup, teardown)

    # -- native thread ----------------------------------------------------------------------------
    def _run(self, setup: Callable[[], S], teardown: Callable[[S], None] | None) -> None:
        self.thread_id = _get_ident()
        _workers[self.thread_id] = self
        state: Any = None
        try:
            state = setup()
        except BaseException as e:  # noqa: BLE001 - reported to the hub, not raised in a thread
            self._closed = True  # nothing will ever read the inbox: submits fail from now on
            self._post(self.ready, False, contained(e, f"instance '{self.name}' failed to load"))
            self._drain_unread(f"instance '{self.name}' failed to load: {e}")
            self._post(self.stopped, True, True)
            _workers.pop(self.thread_id, None)
            return
        self.used_hub = get_hub_if_exists() is not None
        self._post(self.ready, True, True)
        try:
            self._serve(state)
        except BaseException as e:  # noqa: BLE001 - the loop itself failed: the instance is dead
            self.died = e
            self._closed = True
            log.error("native worker %s stopped unexpectedly: %r", self.name, e)
            text = f"instance '{self.name}' stopped unexpectedly: {e!r}"
            if self._current is not None:  # the call it was running when it failed is answered too
                from ..errors import TritonError

                self._post(self._current[2], False, TritonError.unavailable(text))
            self._drain_unread(text)
        finally:
            _workers.pop(self.thread_id, None)
            if teardown is not None:
                try:
                    teardown(state)
                except BaseException as e:  # noqa: BLE001
                    print(f"[{self.name}] teardown failed: {e!r}", file=sys.stderr)
            self._post(self.stopped, True, True)

    def _serve(self, state: Any) -> None:
        """Native thread: run submitted calls until the ``None`` that :meth:`close` queues."""
        while (item := self._next_item()) is not None:
            fn, args, reply = item
            self._current = item  # answered by the death handler in _run if this loop fails mid-call
            self.busy = True
            try:
                value = fn(state, *args)
            except BaseException as e:  # noqa: BLE001
                self.busy = False
                self._note_hub()
                self._post(reply, False, contained(e, f"instance '{self.name}' failed"))
            else:
                self.busy = False
                self._note_hub()
                self._post(reply, True, value)
            self._current = None

    def _next_item(self) -> Any:
        """Native thread: :meth:`_next`, surviving what gevent throws into this thread's main greenlet
        while it waits: a SystemExit or KeyboardInterrupt raised by a greenlet the model left on this
        thread's hub is re-raised here (gevent's rule for system errors). That greenlet is over, the
        instance is not: it goes on serving (before, the thread ended and requests waited forever).
        ``MAX_INTERRUPTIONS`` in a row without work in between means something else is broken."""
        for _ in range(MAX_INTERRUPTIONS):
            try:
                return self._next()
            except BaseException as e:  # noqa: BLE001
                log.error("instance %s: a greenlet of the model ended with %r; the instance keeps serving", self.name, e)
        raise RuntimeError(f"{MAX_INTERRUPTIONS} interruptions in a row while waiting for work")

    def _note_hub(self) -> None:
        if not self.used_hub and get_hub_if_exists() is not None:
            self.used_hub = True

    def _next(self) -> Any:
        """Native thread: the next work item. While the model has no gevent hub in this thread, block
        on the C queue (cheapest). Once model code created one (it started a "thread" — a greenlet,
        with ``threading`` patched — or slept, or waited on a lock), wait in that hub instead, so the
        model's greenlets keep running while the instance is idle: a decoupled model answering from a
        thread it started (as Triton's examples do) must get to send."""
        if self._hub is None:
            hub = get_hub_if_exists()
            if hub is None:
                return self._inbox.get()
            # one watcher, started once and never stopped: a send() that arrives while this thread is
            # busy is remembered in the event instead of being lost (libev forgets sends to a stopped
            # watcher)
            self._idle_event = gevent.event.Event()
            self._idle_wake = hub.loop.async_()
            self._idle_wake.start(self._idle_event.set)
            self._hub = hub
        inbox, event = self._inbox, self._idle_event
        while True:
            try:
                return inbox.get_nowait()
            except _queue.Empty:
                pass
            event.clear()
            self._hub_waiting = True  # from now on submitters also send the wake-up (checked after put)
            try:
                return inbox.get_nowait()
            except _queue.Empty:
                event.wait()
            finally:
                self._hub_waiting = False

    def _put(self, item: Any) -> None:
        """Hub thread: queue work for the native thread and wake it however it waits."""
        self._inbox.put(item)
        if self._hub_waiting:
            self._idle_wake.send()

    def _drain_unread(self, text: str) -> None:
        """Native thread, once the inbox is abandoned (``_closed`` set): fail whatever was queued before
        ``_closed`` was seen; :meth:`_fail_unread` does it again in the hub for what raced with it."""
        from ..errors import TritonError

        err = TritonError.unavailable(text)
        for target in self._take_unread():
            self._post(target, False, err)

    def _take_unread(self) -> Iterator[Reply[Any] | Callable[[bool, Any], None]]:
        """Any thread: the replies of the work still in the inbox, taken out of it."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except _queue.Empty:
                return
            if item is not None:
                yield item[2]

    def _post(self, reply: Reply[Any] | Callable[[bool, Any], None], ok: bool, value: Any) -> None:
        self._done.append((reply, ok, value))
        self._wake.send()

    # -- hub thread -------------------------------------------------------------------------------
    def _drain(self) -> None:
        done = self._done
        while done:
            target, ok, value = done.popleft()
            if type(target) is not Reply:
                try:
                    target(ok, value)
                except Exception:
                    log.exception("completion callback of %s failed", self.name)
            elif ok:
                target.set(value)
            else:
                target.fail(value)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Reply[Any]:
        """Queue ``fn(state, *args)`` on the native thread; the reply completes in the hub."""
        reply: Reply[Any] = Reply()
        if self._closed:
            from ..errors import TritonError

            reply.fail(TritonError.unavailable(f"instance '{self.name}' is stopped"))
            return reply
        self._put((fn, args, reply))
        return reply

    def submit_callback(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Callable[[bool, Any], None]) -> None:
        """Like :meth:`submit`, but ``done(ok, value)`` is called in the hub (inside the watcher
        callback: it must not block or switch greenlets) — one wake-up less than a Reply."""
        if self._closed:
            from ..errors import TritonError

            done(False, TritonError.unavailable(f"instance '{self.name}' is stopped"))
            return
        self._put((fn, args, done))

    def close(self, timeout: float | None = 30.0) -> bool:
        """Finish queued work, run teardown, join the thread. True when it stopped in time."""
        if not self._closed:
            self._closed = True
            self._put(None)
        try:
            self.stopped.get(timeout)
        except Exception:  # noqa: BLE001
            # keep the watcher: work the thread still finishes must reach its replies
            log.error("native worker %s did not stop within %s s", self.name, timeout)
            self.stopped.link(lambda _r: self._close_watcher())
            return False
        self._close_watcher()
        return True

    def _fail_unread(self, _stopped: Reply[bool]) -> None:
        """Hub, once the thread stopped: work submitted while it was stopping (before the hub saw
        ``_closed``) is answered too; nothing is ever left in the inbox unanswered."""
        from ..errors import TritonError

        err = TritonError.unavailable(f"instance '{self.name}' is stopped")
        for target in self._take_unread():
            if type(target) is Reply:
                target.fail(err)
            else:
                target(False, err)

    def _close_watcher(self) -> None:
        self._drain()
        self._wake.close()


def call_in_thread(fn: Callable[..., S], *args: Any) -> S:
    """Run a one-off blocking call (e.g. a model's ``auto_complete_config``) on gevent's native
    thread pool, blocking only the calling greenlet; what it raises is raised here. (gevent's pool
    would also log each exception with its traceback, as an error of the pool: a request refused by a
    decode there is the caller's answer, not the server's error, and a client sending such requests
    must not fill the log.)

    The outcome comes in a box that is emptied here: gevent's pool keeps its last result until its next
    task, and an error raised from a name of this frame is a cycle (the frame, the error, its traceback,
    this frame and every caller's up to the handler). Either kept what the callers held: forty refused
    64 MiB JSON bodies left 1 GB of RSS after they were answered."""
    box = gevent.get_hub().threadpool.apply(_outcome, (fn, args))
    if box.pop(0):
        return box.pop()
    raise box.pop()


def _outcome(fn: Callable[..., S], args: tuple[Any, ...]) -> list[Any]:
    try:
        return [True, fn(*args)]
    except Exception as e:  # noqa: BLE001 - handed to the caller, who raises it
        return [False, e]


class HubSignal:
    """A thread-safe wake-up: ``send()`` from any thread makes ``callback()`` run in the hub (sends that
    arrive before the hub gets to it coalesce into one call). Create and close it in the hub thread."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.start(callback)

    def send(self) -> None:
        self._watcher.send()

    def close(self) -> None:
        self._watcher.close()


class CancelWatch:
    """``InferRequest.is_cancelled`` for a backend that must be told rather than look (a Python model
    in a process of its own): called, it answers as the plain probe does (True once the request's
    reply completed while it ran, i.e. its client cancelled it); :attr:`callback`, set and cleared by
    the backend's native thread around the run, is called in the hub when that happens. It must not
    block the hub (a write to a pipe goes to a ``threads.SerialWriter``). Created in the hub (the scheduler), one
    per request of a batch; nothing runs while nobody cancels but the reply's completion callback."""

    __slots__ = ("_reply", "callback")

    def __init__(self, reply: Reply[Any]) -> None:
        self._reply = reply
        self.callback: Callable[[], None] | None = None
        reply.link(self._completed)

    def __call__(self) -> bool:
        return self._reply.ready()

    def _completed(self, _reply: Reply[Any]) -> None:
        callback = self.callback  # None once the run ended: the usual answer, not a cancellation
        if callback is not None:
            callback()


def workers_tagged(tag: Any) -> list[NativeWorker[Any]]:
    """Every running worker whose owner tagged it ``tag`` (any thread; a snapshot)."""
    return [w for w in list(_workers.values()) if w.tag == tag]


def this_thread_hub() -> Any:
    """The gevent hub of the calling thread, or None if it has none (never creates one)."""
    return get_hub_if_exists()


def current_worker() -> NativeWorker[Any] | None:
    """The :class:`NativeWorker` whose native thread is calling (None on the hub or another thread)."""
    ident = _get_ident()
    return _workers.get(ident) or _acting.get(ident)


def act_for(worker: NativeWorker[Any] | None) -> None:
    """This thread (an instance's asyncio loop) runs that instance's model code: :func:`current_worker`
    answers ``worker`` here, so BLS calls made from coroutines count as the instance's (the BLS cycle
    check). None: stop (at the thread's end)."""
    if worker is None:
        _acting.pop(_get_ident(), None)
    else:
        _acting[_get_ident()] = worker


class InlineRun:
    """A run of a promoted instance whose model calls the server (BLS, model control), in a hub greenlet of
    its own (``actors/scheduling/instance.py``): its calls are served on that greenlet, waiting cooperatively,
    instead of raising :class:`RunOnThread`, with no thread crossing (a target that runs inline runs on the
    same stack). To the schedulers the instance is a thread instance (taken from the pool, answered through
    its completion), so no scheduler is held while a call waits: its other instances, and calls back to
    it, are served as on the thread path. ``worker.busy`` is set for the run (the BLS wait graph).
    ``calls`` counts the calls (a run that made one is never run again on the thread: the target would
    run twice); ``in_call`` is True while one is served, so model code that runs on this greenlet
    meanwhile (a target run inline on the same stack) is not taken for the caller; the waits' CPU and wall
    time, which other greenlets used, are left out of the run's demotion figures."""

    __slots__ = ("worker", "calls", "in_call", "waited_cpu", "waited_wall")

    def __init__(self, worker: NativeWorker[Any]) -> None:
        self.worker = worker  # the instance's, for the BLS wait graph
        self.calls = 0
        self.in_call = False
        self.waited_cpu = self.waited_wall = 0

    def waiting(self) -> tuple[int, int]:
        """A call starts: the clocks now, for :meth:`resumed`."""
        self.calls += 1
        self.in_call = True
        return _thread_ns(), _perf_ns()

    def resumed(self, mark: tuple[int, int]) -> None:
        self.in_call = False
        self.waited_cpu += _thread_ns() - mark[0]
        self.waited_wall += _perf_ns() - mark[1]


# hub greenlet running an InlineRun → that run (hub thread only; one entry per run in progress)
_inline_runs: dict[Any, InlineRun] = {}


def inline_run() -> InlineRun | None:
    """Hub thread: the :class:`InlineRun` of the calling greenlet, if a model runs there that may call the server."""
    return _inline_runs.get(gevent.getcurrent())


def enter_inline_run(run: InlineRun) -> Any:
    """Hub greenlet: ``run`` is the calling greenlet's until :func:`leave_inline_run` with what this returns."""
    greenlet = gevent.getcurrent()
    _inline_runs[greenlet] = run
    return greenlet


def leave_inline_run(greenlet: Any) -> None:
    _inline_runs.pop(greenlet, None)


SERVER_CALL = "server call"  # RunOnThread's cause when the model called the server (BLS, model control)


class RunOnThread(BaseException):
    """Raised into model code that called the server while running on the hub (an inline execution):
    the call would have to wait for the hub it is blocking. A BaseException so that a model's
    ``except Exception`` does not swallow it; :class:`~..actors.scheduling.instance.ModelInstance` catches it, runs the
    batch again on the instance's own thread and never promotes that instance again."""

"""A small actor kernel on gevent: mailboxes, typed dispatch, asks with replies, supervision.

Vocabulary (the words the rest of ``actors/`` uses, and what they mean in code):

* An **actor** (:class:`Actor`) owns its state and a mailbox (a gevent Queue) drained by **its own loop
  greenlet**; handlers of one actor run one at a time, in order. Others hold an :class:`ActorRef` (or a
  typed facade over it, such as ``RepositoryRef`` or ``ModelRef``): ``tell`` posts a message, ``ask``
  posts it and waits for the handler's return value. RepositoryActor and ModelActor are actors.
* An **inline actor** (:class:`InlineActor`) is an actor whose handlers never block. It is a fast path
  (:mod:`triton_actor.runtime.fastpath`): while fast paths are on, a message posted to an idle inline actor is
  handled at once on the sender's stack and messages posted meanwhile are queued and handled by that
  same drain, so it has no loop greenlet; with fast paths off (read when it starts) it runs as a
  plain :class:`Actor` with its own loop greenlet, same handlers, same answers. SchedulerActor is one.
* A **single-owner hub object** is not an actor: no mailbox of ours, no loop. Exactly one owner calls
  its methods, from the hub thread, and it never blocks the caller. ``NativeWorker`` (the thread bridge:
  its "mailbox" is its native thread's queue, results come back through a hub watcher),
  ``ModelInstance`` (one backend instance on one NativeWorker, owned by its version's scheduler) and
  the ``Version`` records (owned by their ModelActor) are such objects.

Requests and replies: a message that is answered later carries its own :class:`Reply` in a ``reply``
field (``Enqueue``, ``Load``, ``Drain``); the handler completes it now or later (for instance when
another actor's reply completes). A handler never returns a Reply. An ``ask`` is for a message whose
answer is the handler's return value (``Index``, ``GetStats``).

Failure semantics (tested in ``tests/unit/runtime/test_kernel.py``):

* an exception raised while handling an **ask**, or a message that carries its own not yet completed
  ``reply``, goes back to the asker (that reply fails with it); the actor lives on;
* an exception raised while handling a **tell** is reported to the supervisor as a
  :class:`ChildFailed` message (handled by its ``on_child_failure``, which decides: the default logs
  and stops the child, RepositoryActor restarts a ModelActor within a budget); with no live parent,
  the actor logs it and stops;
* when an actor stops, every ask still in its mailbox fails with UNAVAILABLE, and so does the own
  ``reply`` of every message still there, so nobody waits forever (``on_dropped`` sees the rest);
* ``ask`` raises on timeout; it never returns None for a missing answer.

Handlers must not block on an ask to another actor (A asks B while B asks A deadlocks): tell with a
:class:`Reply` inside the message and handle the answer as a message, or spawn a tracked greenlet.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

import gevent
import gevent.event
import gevent.queue

from ..errors import TritonError
from . import fastpath

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class Reply(Generic[T]):
    """A one-shot answer: set once (value or error), awaited by any greenlet.

    Its answer is kept in plain slots; the gevent ``AsyncResult`` a greenlet waits on or a link hangs from
    is made only when one asks (``get``, ``wait_or``, ``link``): most replies are answered on the stack
    that asked (a direct run) and read with ``ready``/``value``, and never need one (1.5 -> 0.5 us for
    a reply made, set and read, measured with timeit).

    A failed reply keeps its error's traceback as it was at ``fail`` and raises the error with that one
    each time: a raise adds its own frames to the error's traceback, so a reply failed once and read by
    many waiters (an on-demand load that failed) would otherwise grow one shared traceback by every
    waiter's frames, and hold them."""

    __slots__ = ("_result", "_done", "_value", "_error", "_trace")

    def __init__(self) -> None:
        self._result: Any = None
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._trace: TracebackType | None = None

    def set(self, value: T) -> None:
        if not self._done:
            self._done, self._value = True, value
            if self._result is not None:
                self._result.set(value)

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._done, self._error, self._trace = True, error, error.__traceback__
            if self._result is not None:
                self._result.set_exception(error)

    def ready(self) -> bool:
        return self._done

    def _waitable(self) -> gevent.event.AsyncResult:
        result = self._result
        if result is None:
            result = self._result = gevent.event.AsyncResult()
            if self._error is not None:
                result.set_exception(self._error)
            elif self._done:
                result.set(self._value)
        return result

    def get(self, timeout: float | None = None) -> T:
        """Wait for the answer; raises the error it failed with, or UNAVAILABLE on timeout."""
        if self._done:
            if self._error is not None:
                raise self._error.with_traceback(self._trace)
            return self._value
        try:
            return self._waitable().get(timeout=timeout)
        except gevent.Timeout:
            raise TritonError.unavailable(f"no answer within {timeout} s") from None

    def wait_or(self, event: gevent.event.Event) -> bool:
        """Wait until answered or ``event`` is set (this greenlet); True when answered."""
        if not self._done:
            gevent.wait([self._waitable(), event], count=1)
        return self._done

    def link(self, callback: Callable[[Reply[T]], None]) -> None:
        """Call ``callback(self)`` in the hub once the answer is there."""
        self._waitable().rawlink(lambda _ar: callback(self))

    def exception(self) -> BaseException | None:
        return self._error

    def value(self) -> T:
        return self._value


def _table_of(cls: type) -> dict[type, Callable[..., Any]]:
    """The handler table of actor class ``cls`` (message class → handler, filled as messages come), one
    per class, not inherited: each class finds its own ``on_*`` methods."""
    table = cls.__dict__.get("_dispatch_table")
    if table is None:
        table = {}
        cls._dispatch_table = table  # type: ignore[attr-defined]
    return table


class ChildFailed:
    """Event to a supervisor: ``child`` raised ``error`` while handling a tell."""

    __slots__ = ("child", "error")

    def __init__(self, child: Actor, error: BaseException) -> None:
        self.child = child
        self.error = error


def _unhandled(actor: Actor, message: object) -> None:
    raise TritonError.internal(f"actor '{actor.name}' does not handle {type(message).__name__}")


class ActorRef:
    """What other code holds: tell and ask, never the actor's state."""

    __slots__ = ("_actor", "name")

    def __init__(self, actor: Actor) -> None:
        self._actor = actor
        self.name = actor.name

    def tell(self, message: object) -> None:
        self._actor._post(message, None)

    def ask_async(self, message: object) -> Reply[Any]:
        """Post ``message``; the Reply completes with the handler's return value (or its error). A
        message that carries its own ``reply`` is told, not asked (that reply is its answer)."""
        if hasattr(message, "reply"):  # even when left None: its handler answers there, not here
            raise TypeError(f"{type(message).__name__} carries its own reply: tell it")
        reply: Reply[Any] = Reply()
        self._actor._post(message, reply)
        return reply

    def ask(self, message: object, timeout: float | None = None) -> Any:
        """Post ``message`` and wait for the handler's return value; raises UNAVAILABLE on timeout."""
        return self.ask_async(message).get(timeout)

    def stop(self, timeout: float | None = None) -> None:
        self._actor.stop(timeout)

    @property
    def alive(self) -> bool:
        return self._actor.alive

    def __repr__(self) -> str:
        return f"<ActorRef {self.name}>"


class Actor:
    """Base class: subclasses define ``on_<MessageClass>`` handlers (found by message class name).

    One greenlet runs the mailbox loop, so handlers of one actor never interleave with each other
    except where a handler itself yields (avoid that; spawn a helper greenlet instead).
    """

    mailbox_size: ClassVar[int | None] = None  # None = unbounded
    ref_class: ClassVar[type[ActorRef]] = ActorRef  # the typed facade others hold
    _dispatch_table: ClassVar[dict[type, Callable[..., Any]]]  # per subclass: message class → handler

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        self.name = name
        self.parent = parent
        self._inbox: gevent.queue.Queue = gevent.queue.Queue(self.mailbox_size)
        self._loop: gevent.Greenlet | None = None
        self._stopping = False
        self._current: tuple[object, Reply[Any] | None] | None = None  # being handled: failed if the loop dies
        self._table = _table_of(type(self))  # the class's handlers, read here by every message
        self.ref = self.ref_class(self)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ActorRef:
        self.on_start()
        self._loop = gevent.spawn(self._mailbox_loop)
        self._loop.name = f"actor:{self.name}"
        return self.ref

    @property
    def alive(self) -> bool:
        return self._loop is not None and not self._loop.dead and not self._stopping

    def stop(self, timeout: float | None = None) -> None:
        """Finish the message being handled, fail every queued ask with UNAVAILABLE, run ``on_stop``.
        Waits for the loop to end (unless called from the loop itself)."""
        if self._loop is None or self._loop.dead:
            return
        if not self._stopping:
            self._stopping = True
            self._inbox.put((_STOP, None))
        if gevent.getcurrent() is not self._loop:
            self._loop.join(timeout)

    def on_start(self) -> None:
        """Runs in the starter's greenlet before the loop starts."""

    def on_stop(self) -> None:
        """Runs in the actor's greenlet after the last message."""

    def on_ChildFailed(self, msg: ChildFailed) -> None:
        self.on_child_failure(msg.child, msg.error)

    def on_child_failure(self, child: Actor, error: BaseException) -> None:
        """A child failed while handling a tell. Default: log and stop the child."""
        log.error("actor %s failed: %r; stopping it", child.name, error)
        child.stop(timeout=0)

    def on_dropped(self, message: object) -> None:
        """A message left in the mailbox when the actor stopped (its replies already failed). Runs in
        the greenlet that finishes the actor. Override to answer what the message stands for."""

    # -- mailbox --------------------------------------------------------------------------------
    def _refuse(self, reply: Reply[Any] | None) -> None:
        """A message for an actor that is not running: the ask fails, the tell raises."""
        err = TritonError.unavailable(f"actor '{self.name}' is not running")
        if reply is None:
            raise err
        reply.fail(err)

    def _post(self, message: object, reply: Reply[Any] | None) -> None:
        if self._stopping or self._loop is None or self._loop.dead:
            self._refuse(reply)
            return
        self._inbox.put((message, reply))

    def _mailbox_loop(self) -> None:
        try:
            while not self._stopping:
                item = self._inbox.get()
                message, reply = item
                if message is _STOP:
                    break
                self._current = item
                self._handle(message, reply)
                self._current = None
        finally:
            self._stopping = True
            if self._current is not None:  # the loop died inside a handler (killed, Timeout, ...)
                self._drop(*self._current)
                self._current = None
            self._fail_pending()
            try:
                self.on_stop()
            except Exception:
                log.exception("on_stop of actor %s failed", self.name)

    def _handle(self, message: object, reply: Reply[Any] | None) -> None:
        cls = type(message)
        table = self._table
        handler = table.get(cls)
        if handler is None:
            handler = table[cls] = getattr(type(self), "on_" + cls.__name__, None) or _unhandled
        try:
            result = handler(self, message)
        except Exception as e:
            own = getattr(message, "reply", None)
            if reply is not None:
                reply.fail(e)
            elif isinstance(own, Reply) and not own.ready():
                own.fail(e)  # an error while answering goes back to the asker
            elif self.parent is not None and self.parent.alive:
                self.parent.ref.tell(ChildFailed(self, e))  # through the supervisor's mailbox
            else:
                log.exception("actor %s failed on %s; stopping", self.name, type(message).__name__)
                self.stop(timeout=0)
        else:
            if reply is not None:
                if isinstance(result, Reply):  # a reply inside a reply: the message should carry it
                    reply.fail(TritonError.internal(f"{type(message).__name__} handler returned a Reply"))
                else:
                    reply.set(result)

    def _fail_pending(self) -> None:
        while True:
            try:
                message, reply = self._inbox.get_nowait()
            except gevent.queue.Empty:
                return
            if message is not _STOP:
                self._drop(message, reply)

    def _drop(self, message: object, reply: Reply[Any] | None) -> None:
        """A message the stopped actor will never handle: its ask and its own reply fail UNAVAILABLE."""
        error = TritonError.unavailable(f"actor '{self.name}' stopped")
        if reply is not None:
            reply.fail(error)
        own = getattr(message, "reply", None)
        if isinstance(own, Reply):
            own.fail(error)
        try:
            self.on_dropped(message)
        except Exception:
            log.exception("on_dropped of actor %s failed", self.name)


class InlineActor(Actor):
    """An actor whose handlers never block; while fast paths are on it has no loop greenlet.

    A message posted while the actor is idle is handled at once on the sender's stack (a request
    greenlet, or a hub callback such as an instance's completion); a message posted while a handler
    runs is queued and handled by that same drain loop right after. Messages are therefore still
    handled one at a time and in order, and the hot path saves two greenlet switches per hop
    (~15-25 µs each here). Handlers must not block or ask other actors: a handler that yields would
    let other greenlets queue behind it, which stays correct but loses the point.

    This is a fast path: with :data:`triton_actor.runtime.fastpath.enabled` off when :meth:`start` runs, the
    actor runs as a plain :class:`Actor` (mailbox, own loop greenlet) with the same handlers. The
    handlers then run in the loop greenlet, and messages from hub callbacks (completions, timers)
    arrive through the mailbox like any other.

    Its owner may also :meth:`hold` an idle inline actor and do a handler's work on the caller's stack
    with no message at all (the scheduler's direct run), then :meth:`unhold` it.
    """

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        super().__init__(name, parent)
        self._pending: collections.deque[tuple[object, Reply[Any] | None]] = collections.deque()
        self._draining = False
        self._started = False
        self._inline = False  # started inline and not stopping: the one check on the hot path
        self._finished = gevent.event.Event()

    def start(self) -> ActorRef:
        if not fastpath.enabled:
            return super().start()  # the slow path: a plain actor with its loop greenlet
        self.on_start()
        self._started = self._inline = True
        return self.ref

    @property
    def alive(self) -> bool:
        if self._loop is not None:
            return super().alive
        return self._started and not self._stopping

    def _post(self, message: object, reply: Reply[Any] | None) -> None:
        if not self._inline:  # not started, stopping, or running with a loop greenlet
            if self._started and self._stopping:
                self._refuse(reply)
            else:
                super()._post(message, reply)  # the loop's mailbox; refuses when not running
            return
        self._pending.append((message, reply))
        if not self._draining:
            self._drain_mailbox()

    def _drain_mailbox(self) -> None:
        self._draining = True
        pending = self._pending
        try:
            while pending:
                message, reply = pending.popleft()
                if self._stopping:
                    pending.appendleft((message, reply))
                    self._finish()
                    return
                self._handle(message, reply)
            if self._stopping:  # a handler stopped the actor
                self._finish()
        finally:
            self._draining = False

    def hold(self) -> bool:
        """Claim the actor for work its owner does on the caller's stack in place of handling a message
        (a fast path: the scheduler's direct run, actors/scheduling/scheduler.py). Only an actor that
        runs inline, is idle and has nothing queued can be held, so the work overtakes no message.
        While held, messages sent to it queue up as during a handler; :meth:`unhold` handles them."""
        if self._inline and not self._draining:
            self._draining = True
            return True
        return False

    def unhold(self) -> None:
        """End a :meth:`hold`: what was sent meanwhile is handled now, in order, and a stop requested
        meanwhile finishes, as after a handler."""
        self._draining = False
        if self._pending or self._stopping:
            self._drain_mailbox()

    def stop(self, timeout: float | None = None) -> None:
        if self._loop is not None:
            super().stop(timeout)
            return
        if not self._started or self._finished.is_set():
            return
        if not self._stopping:
            self._stopping = True
            self._inline = False
            if not self._draining:
                self._finish()
            # else: the drain loop finishes after the handler that is running now
        if gevent.getcurrent() is not gevent.get_hub():
            self._finished.wait(timeout)

    def _finish(self) -> None:
        if self._finished.is_set():
            return
        while self._pending:
            self._drop(*self._pending.popleft())
        try:
            self.on_stop()
        except Exception:
            log.exception("on_stop of actor %s failed", self.name)
        self._finished.set()

"""A small actor kernel on gevent: mailboxes, typed dispatch, asks with replies, supervision.

Failure semantics (tested in ``tests/unit/test_kernel.py``):

* an exception raised while handling an **ask** goes back to the asker; the actor lives on;
* an exception raised while handling a **tell** is reported to the supervisor as a
  :class:`ChildFailed` message (handled by its ``on_child_failure``); with no live parent, the actor
  logs it and stops;
* when an actor stops, every ask still in its mailbox fails with UNAVAILABLE, so nobody waits forever;
* ``ask`` raises on timeout; it never returns None for a missing answer.

Handlers must not block on an ask to another actor (A asks B while B asks A deadlocks): tell with a
:class:`Reply` inside the message and handle the answer as a message, or spawn a tracked greenlet.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import gevent
import gevent.event
import gevent.queue

from ..errors import TritonError

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class Reply(Generic[T]):
    """A one-shot answer: set once (value or error), awaited by any greenlet."""

    __slots__ = ("_result",)

    def __init__(self) -> None:
        self._result = gevent.event.AsyncResult()

    def set(self, value: T) -> None:
        if not self._result.ready():
            self._result.set(value)

    def fail(self, error: BaseException) -> None:
        if not self._result.ready():
            self._result.set_exception(error)

    def ready(self) -> bool:
        return self._result.ready()

    def get(self, timeout: float | None = None) -> T:
        """Wait for the answer; raises the error it failed with, or UNAVAILABLE on timeout."""
        try:
            return self._result.get(timeout=timeout)
        except gevent.Timeout:
            raise TritonError.unavailable(f"no answer within {timeout} s") from None

    def link(self, callback: Callable[[Reply[T]], None]) -> None:
        """Call ``callback(self)`` in the hub once the answer is there."""
        self._result.rawlink(lambda _ar: callback(self))

    def exception(self) -> BaseException | None:
        return self._result.exception

    def value(self) -> T:
        return self._result.value


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
        reply: Reply[Any] = Reply()
        self._actor._post(message, reply)
        return reply

    def ask(self, message: object, timeout: float | None = None) -> Any:
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
    _dispatch_table: ClassVar[dict[type, Callable[..., Any]]]  # per subclass: message class → handler

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        self.name = name
        self.parent = parent
        self._inbox: gevent.queue.Queue = gevent.queue.Queue(self.mailbox_size)
        self._loop: gevent.Greenlet | None = None
        self._stopping = False
        self._current: Reply[Any] | None = None  # the ask being handled, failed if the loop dies
        self.ref = ActorRef(self)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ActorRef:
        self.on_start()
        self._loop = gevent.spawn(self._run)
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

    def _run(self) -> None:
        try:
            while not self._stopping:
                message, reply = self._inbox.get()
                if message is _STOP:
                    break
                self._current = reply
                self._handle(message, reply)
                self._current = None
        finally:
            self._stopping = True
            if self._current is not None:  # the loop died inside a handler (killed, Timeout, ...)
                self._current.fail(TritonError.unavailable(f"actor '{self.name}' stopped"))
                self._current = None
            self._fail_pending()
            try:
                self.on_stop()
            except Exception:
                log.exception("on_stop of actor %s failed", self.name)

    def _handle(self, message: object, reply: Reply[Any] | None) -> None:
        cls = type(message)
        table = type(self).__dict__.get("_dispatch_table")
        if table is None:
            table = {}
            type(self)._dispatch_table = table
        handler = table.get(cls)
        if handler is None:
            handler = table[cls] = getattr(type(self), "on_" + cls.__name__, None) or _unhandled
        try:
            result = handler(self, message)
        except Exception as e:
            if reply is not None:
                reply.fail(e)
            elif self.parent is not None and self.parent.alive:
                self.parent.ref.tell(ChildFailed(self, e))  # through the supervisor's mailbox
            else:
                log.exception("actor %s failed on %s; stopping", self.name, type(message).__name__)
                self.stop(timeout=0)
        else:
            if reply is not None:
                reply.set(result)

    def _fail_pending(self) -> None:
        while True:
            try:
                message, reply = self._inbox.get_nowait()
            except gevent.queue.Empty:
                return
            if reply is not None and message is not _STOP:
                reply.fail(TritonError.unavailable(f"actor '{self.name}' stopped"))


class InlineActor(Actor):
    """An actor whose handlers never block: it has no loop greenlet.

    A message posted while the actor is idle is handled at once on the sender's stack (a request
    greenlet, or a hub callback such as an instance's completion); a message posted while a handler
    runs is queued and handled by that same drain loop right after. Messages are therefore still
    handled one at a time and in order, and the hot path saves two greenlet switches per hop
    (~15-25 µs each here). Handlers must not block or ask other actors: a handler that yields would
    let other greenlets queue behind it, which stays correct but loses the point.
    """

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        super().__init__(name, parent)
        self._pending: collections.deque[tuple[object, Reply[Any] | None]] = collections.deque()
        self._draining = False
        self._started = False
        self._finished = gevent.event.Event()

    def start(self) -> ActorRef:
        self.on_start()
        self._started = True
        return self.ref

    @property
    def alive(self) -> bool:
        return self._started and not self._stopping

    def _post(self, message: object, reply: Reply[Any] | None) -> None:
        if self._stopping or not self._started:
            self._refuse(reply)
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
                if message is _STOP or self._stopping:
                    if message is not _STOP:
                        pending.appendleft((message, reply))
                    self._finish()
                    return
                self._handle(message, reply)
            if self._stopping:  # a handler stopped the actor
                self._finish()
        finally:
            self._draining = False

    def stop(self, timeout: float | None = None) -> None:
        if not self._started or self._finished.is_set():
            return
        if not self._stopping:
            self._stopping = True
            if not self._draining:
                self._finish()
            # else: the drain loop finishes after the handler that is running now
        if gevent.getcurrent() is not gevent.get_hub():
            self._finished.wait(timeout)

    def _finish(self) -> None:
        if self._finished.is_set():
            return
        while self._pending:
            message, reply = self._pending.popleft()
            if reply is not None and message is not _STOP:
                reply.fail(TritonError.unavailable(f"actor '{self.name}' stopped"))
        try:
            self.on_stop()
        except Exception:
            log.exception("on_stop of actor %s failed", self.name)
        self._finished.set()

"""Failure semantics of the actor kernel (``triton_actor/runtime/kernel.py``).

Every wait below is on an event or a reply with a timeout; nothing sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gevent
import gevent.event
import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.runtime.kernel import Actor, ActorRef, InlineActor, Reply

WAIT = 5.0


@dataclass(frozen=True, slots=True)
class Ping:
    value: int


@dataclass(frozen=True, slots=True)
class Boom:
    text: str


@dataclass(frozen=True, slots=True)
class Block:
    release: gevent.event.Event
    started: gevent.event.Event = field(default_factory=gevent.event.Event)


@dataclass(frozen=True, slots=True)
class Unknown:
    pass


class Echo(Actor):
    """Answers Ping with its value, raises on Boom, blocks on Block until released."""

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        super().__init__(name, parent)
        self.handled: list[object] = []
        self.stopped = gevent.event.Event()

    def on_Ping(self, msg: Ping) -> int:
        self.handled.append(msg)
        return msg.value

    def on_Boom(self, msg: Boom) -> None:
        self.handled.append(msg)
        raise ValueError(msg.text)

    def on_Block(self, msg: Block) -> str:
        self.handled.append(msg)
        msg.started.set()
        msg.release.wait()
        return "unblocked"

    def on_stop(self) -> None:
        self.stopped.set()


class Supervisor(Actor):
    """A parent that records child failures instead of stopping the child."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.failures: list[tuple[Actor, BaseException]] = []
        self.failed = gevent.event.Event()

    def on_child_failure(self, child: Actor, error: BaseException) -> None:
        self.failures.append((child, error))
        self.failed.set()


@pytest.fixture
def actors():
    started: list[Actor] = []

    def start(actor: Actor) -> ActorRef:
        started.append(actor)
        return actor.start()

    yield start
    for actor in started:
        actor.stop(timeout=WAIT)


def _unavailable(reply: Reply[object]) -> TritonError:
    """The reply must already have failed with UNAVAILABLE; return the error."""
    assert reply.ready(), "reply was never completed"
    error = reply.exception()
    assert isinstance(error, TritonError), repr(error)
    assert error.code == Code.UNAVAILABLE
    return error


# -- asks ------------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_ask_returns_the_handler_result(actors) -> None:
    ref = actors(Echo("echo"))
    assert ref.ask(Ping(7), timeout=WAIT) == 7
    assert ref.ask(Ping(0), timeout=WAIT) == 0


@pytest.mark.timeout(30)
def test_error_in_ask_goes_to_asker_and_actor_lives_on(actors) -> None:
    parent = Supervisor("parent")
    actors(parent)
    echo = Echo("echo", parent=parent)
    ref = actors(echo)
    with pytest.raises(ValueError, match="bad ask"):
        ref.ask(Boom("bad ask"), timeout=WAIT)
    assert ref.alive
    assert ref.ask(Ping(3), timeout=WAIT) == 3
    # an ask failure is the asker's business, never the supervisor's
    assert parent.failures == []
    assert not echo.stopped.is_set()


@pytest.mark.timeout(30)
def test_unknown_message_fails_the_asker_and_actor_lives_on(actors) -> None:
    ref = actors(Echo("echo"))
    with pytest.raises(TritonError) as info:
        ref.ask(Unknown(), timeout=WAIT)
    assert info.value.code == Code.INTERNAL
    assert "Unknown" in info.value.message
    assert "echo" in info.value.message
    assert ref.ask(Ping(4), timeout=WAIT) == 4


@pytest.mark.timeout(30)
def test_ask_timeout_raises_triton_error_never_none(actors) -> None:
    release = gevent.event.Event()
    ref = actors(Echo("slow"))
    with pytest.raises(TritonError) as info:
        ref.ask(Block(release), timeout=0.05)
    assert info.value.code == Code.UNAVAILABLE
    release.set()
    # the actor is still healthy once the slow handler finishes
    assert ref.ask(Ping(1), timeout=WAIT) == 1


@pytest.mark.timeout(30)
def test_reply_get_timeout_raises_and_set_is_one_shot() -> None:
    reply: Reply[int] = Reply()
    with pytest.raises(TritonError) as info:
        reply.get(timeout=0.01)
    assert info.value.code == Code.UNAVAILABLE
    reply.set(1)
    reply.set(2)
    reply.fail(RuntimeError("late"))
    assert reply.get(timeout=0) == 1
    assert reply.exception() is None



def _depth(tb) -> int:
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def _failed_reply() -> Reply[int]:
    reply: Reply[int] = Reply()
    try:
        raise TritonError.unavailable("load failed")
    except TritonError as e:
        reply.fail(e)
    return reply


def test_a_failed_reply_read_many_times_raises_with_its_own_traceback_each_time() -> None:
    """Every waiter of a reply failed once raises the one error: each raise must start from the trace the
    error had when the reply failed, not from the previous waiter's, which a plain re-raise extends."""
    reply = _failed_reply()
    first = _depth(reply.exception().__traceback__)
    depths = []
    for _ in range(50):
        with pytest.raises(TritonError) as info:
            reply.get()
        depths.append(_depth(info.value.__traceback__))
    assert len(set(depths)) == 1, depths[:5]
    assert depths[0] == first + 2  # this frame and get's on top of the trace the error was raised with
    # the same through a waiter that blocks (the AsyncResult made on demand)
    waiter = _failed_reply()
    waiter._waitable()
    for _ in range(5):
        with pytest.raises(TritonError):
            waiter.get()
    assert _depth(waiter.exception().__traceback__) <= first + 2


# -- tells and supervision -------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_error_in_tell_goes_to_parent_on_child_failure(actors) -> None:
    parent = Supervisor("parent")
    actors(parent)
    child = Echo("child", parent=parent)
    ref = actors(child)
    ref.tell(Boom("bad tell"))
    assert parent.failed.wait(WAIT)
    assert len(parent.failures) == 1
    failed_child, error = parent.failures[0]
    assert failed_child is child
    assert isinstance(error, ValueError)
    assert str(error) == "bad tell"
    # this supervisor chose not to stop the child: it keeps serving
    assert ref.alive
    assert ref.ask(Ping(5), timeout=WAIT) == 5


@pytest.mark.timeout(30)
def test_default_supervisor_stops_the_failed_child(actors) -> None:
    parent = Actor("plain-parent")
    actors(parent)
    child = Echo("child", parent=parent)
    ref = actors(child)
    ref.tell(Boom("fatal"))
    assert child.stopped.wait(WAIT)
    assert not ref.alive
    assert parent.alive


@pytest.mark.timeout(30)
def test_error_in_tell_without_parent_stops_the_actor(actors) -> None:
    orphan = Echo("orphan")
    ref = actors(orphan)
    ref.tell(Boom("nobody supervises me"))
    assert orphan.stopped.wait(WAIT)
    assert not ref.alive
    with pytest.raises(TritonError) as info:
        ref.ask(Ping(1), timeout=WAIT)
    assert info.value.code == Code.UNAVAILABLE


# -- stopping --------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_pending_asks_fail_unavailable_when_actor_stops(actors) -> None:
    """Asks queued behind a busy handler must fail with UNAVAILABLE once the actor is stopped
    (kernel docstring: "when an actor stops, every ask still in its mailbox fails with UNAVAILABLE")."""
    echo = Echo("busy")
    ref = actors(echo)
    release = gevent.event.Event()
    blocker = Block(release)
    in_flight = ref.ask_async(blocker)
    assert blocker.started.wait(WAIT)
    pending = [ref.ask_async(Ping(i)) for i in range(3)]
    echo.stop(timeout=0)  # request the stop while the handler is still blocked
    release.set()
    assert echo.stopped.wait(WAIT)
    # the message being handled when stop() was called finishes normally ...
    assert in_flight.get(timeout=WAIT) == "unblocked"
    # ... but nothing queued behind it runs: every pending ask fails UNAVAILABLE
    for reply in pending:
        _unavailable(reply)
    assert [m for m in echo.handled if isinstance(m, Ping)] == []


@pytest.mark.timeout(30)
def test_killed_actor_fails_in_flight_and_pending_asks(actors) -> None:
    """When the loop greenlet dies (killed at shutdown, say), nobody may wait forever: the ask being
    handled and the ones queued behind it all fail."""
    echo = Echo("doomed")
    ref = actors(echo)
    release = gevent.event.Event()
    blocker = Block(release)
    in_flight = ref.ask_async(blocker)
    assert blocker.started.wait(WAIT)
    pending = [ref.ask_async(Ping(i)) for i in range(3)]
    assert echo._loop is not None
    echo._loop.kill(block=True, timeout=WAIT)
    assert echo.stopped.is_set()
    assert not ref.alive
    for reply in pending:
        _unavailable(reply)
    _unavailable(in_flight)


@pytest.mark.timeout(30)
def test_ask_and_tell_on_stopped_actor_fail_cleanly(actors) -> None:
    echo = Echo("gone")
    ref = actors(echo)
    ref.stop(timeout=WAIT)
    assert echo.stopped.is_set()
    assert not ref.alive
    # an ask fails at once (no waiting for a timeout) with UNAVAILABLE
    reply = ref.ask_async(Ping(1))
    error = _unavailable(reply)
    assert "gone" in error.message
    with pytest.raises(TritonError) as info:
        ref.ask(Ping(1))
    assert info.value.code == Code.UNAVAILABLE
    with pytest.raises(TritonError) as info:
        ref.tell(Ping(1))
    assert info.value.code == Code.UNAVAILABLE
    # stopping twice is harmless
    ref.stop(timeout=WAIT)


@pytest.mark.timeout(30)
def test_ask_and_tell_on_never_started_actor_fail_cleanly() -> None:
    ref = Echo("unstarted").ref
    assert not ref.alive
    _unavailable(ref.ask_async(Ping(1)))
    with pytest.raises(TritonError) as info:
        ref.tell(Ping(1))
    assert info.value.code == Code.UNAVAILABLE


@pytest.mark.timeout(30)
def test_stop_runs_on_stop_once_and_joins(actors) -> None:
    calls: list[str] = []

    class Counting(Actor):
        def on_stop(self) -> None:
            calls.append(self.name)

    actor = Counting("counting")
    ref = actors(actor)
    ref.stop(timeout=WAIT)
    ref.stop(timeout=WAIT)
    assert calls == ["counting"]
    assert actor._loop is not None and actor._loop.dead


@pytest.mark.timeout(30)
def test_messages_are_handled_in_order(actors) -> None:
    echo = Echo("ordered")
    ref = actors(echo)
    for i in range(20):
        ref.tell(Ping(i))
    assert ref.ask(Ping(99), timeout=WAIT) == 99
    assert [m.value for m in echo.handled if isinstance(m, Ping)] == [*range(20), 99]


# -- InlineActor: no loop greenlet, handled on the sender's stack ----------------------------------


class Inline(InlineActor):
    """Records entry/exit of handlers to check that handling never nests."""

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        super().__init__(name, parent)
        self.trace: list[str] = []
        self.stops = 0
        self.stopped = gevent.event.Event()

    def on_Ping(self, msg: Ping) -> int:
        self.trace.append(f"enter {msg.value}")
        if msg.value > 0:
            self.ref.tell(Ping(msg.value - 1))  # posted while handling: queued, handled afterwards
        self.trace.append(f"exit {msg.value}")
        return msg.value

    def on_Boom(self, msg: Boom) -> None:
        raise ValueError(msg.text)

    def on_stop(self) -> None:
        self.stops += 1
        self.stopped.set()


@pytest.mark.timeout(30)
def test_inline_actor_handles_messages_in_order_without_nesting(actors) -> None:
    actor = Inline("inline")
    ref = actors(actor)
    assert ref.ask(Ping(2), timeout=WAIT) == 2
    assert actor.trace == ["enter 2", "exit 2", "enter 1", "exit 1", "enter 0", "exit 0"]


@pytest.mark.timeout(30)
def test_inline_actor_ask_errors_go_to_asker(actors) -> None:
    parent = Supervisor("parent")
    actors(parent)
    ref = actors(Inline("inline", parent=parent))
    with pytest.raises(ValueError, match="bad"):
        ref.ask(Boom("bad"), timeout=WAIT)
    with pytest.raises(TritonError) as info:
        ref.ask(Unknown(), timeout=WAIT)
    assert info.value.code == Code.INTERNAL
    assert ref.alive and ref.ask(Ping(0), timeout=WAIT) == 0
    assert parent.failures == []


@pytest.mark.timeout(30)
def test_inline_actor_tell_errors_go_to_parent(actors) -> None:
    parent = Supervisor("parent")
    actors(parent)
    child = Inline("inline", parent=parent)
    ref = actors(child)
    ref.tell(Boom("bad tell"))
    assert parent.failed.wait(WAIT)
    assert parent.failures[0][0] is child and str(parent.failures[0][1]) == "bad tell"
    assert ref.ask(Ping(0), timeout=WAIT) == 0


@pytest.mark.timeout(30)
def test_inline_actor_without_parent_stops_on_tell_error(actors) -> None:
    orphan = Inline("orphan")
    ref = actors(orphan)
    ref.tell(Boom("fatal"))
    assert orphan.stopped.wait(WAIT) and orphan.stops == 1  # at once inline; soon from a loop (fast paths off)
    assert not ref.alive
    _unavailable(ref.ask_async(Ping(0)))


@pytest.mark.timeout(30)
def test_inline_actor_stop_and_use_after_stop(actors) -> None:
    actor = Inline("inline")
    ref = actors(actor)
    ref.stop(timeout=WAIT)
    ref.stop(timeout=WAIT)
    assert actor.stops == 1
    assert not ref.alive
    _unavailable(ref.ask_async(Ping(0)))
    with pytest.raises(TritonError) as info:
        ref.tell(Ping(0))
    assert info.value.code == Code.UNAVAILABLE
    never = Inline("never-started")
    _unavailable(never.ref.ask_async(Ping(0)))


# -- requests that carry their own Reply -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    reply: Reply[int]
    value: int = 0
    fail: bool = False
    release: gevent.event.Event | None = None
    started: gevent.event.Event = field(default_factory=gevent.event.Event)


class Answering(Actor):
    """Completes each Request's own reply; raises for ``fail``; returns a Reply for a bad ask."""

    def __init__(self, name: str, parent: Actor | None = None) -> None:
        super().__init__(name, parent)
        self.dropped: list[object] = []

    def on_Request(self, msg: Request) -> None:
        msg.started.set()
        if msg.release is not None:
            msg.release.wait()
        if msg.fail:
            raise ValueError("cannot answer")
        msg.reply.set(msg.value)

    def on_Ping(self, msg: Ping) -> Reply[int]:
        out: Reply[int] = Reply()
        out.set(msg.value)
        return out  # wrong: a handler never returns a Reply

    def on_dropped(self, message: object) -> None:
        self.dropped.append(message)


@pytest.mark.timeout(30)
def test_an_error_while_answering_fails_the_messages_own_reply(actors) -> None:
    parent = Supervisor("parent")
    actors(parent)
    ref = actors(Answering("answering", parent=parent))
    reply: Reply[int] = Reply()
    ref.tell(Request(reply, fail=True))
    with pytest.raises(ValueError, match="cannot answer"):
        reply.get(WAIT)
    ok: Reply[int] = Reply()
    ref.tell(Request(ok, 5))
    assert ok.get(WAIT) == 5 and ref.alive
    assert parent.failures == []  # the asker got it, not the supervisor


@pytest.mark.timeout(30)
def test_no_reply_inside_a_reply(actors) -> None:
    ref = actors(Answering("answering"))
    with pytest.raises(TritonError) as info:
        ref.ask(Ping(1), timeout=WAIT)
    assert info.value.code == Code.INTERNAL and "returned a Reply" in info.value.message
    with pytest.raises(TypeError, match="carries its own reply"):
        ref.ask(Request(Reply()), timeout=WAIT)


def test_a_message_whose_reply_is_left_out_is_still_refused_by_ask(actors) -> None:
    """Load(dir) without a reply is POLL's fire-and-forget form: its handler logs failures instead of
    answering, so an ask would return None for a failed load. Refused, whatever the field holds."""
    from pathlib import Path

    from triton_actor.actors.model.messages import Load

    ref = actors(Answering("answering"))
    with pytest.raises(TypeError, match="carries its own reply"):
        ref.ask(Load(Path(".")), timeout=WAIT)


@pytest.mark.timeout(30)
def test_own_replies_of_queued_messages_fail_when_the_actor_stops(actors) -> None:
    actor = Answering("answering")
    ref = actors(actor)
    release = gevent.event.Event()
    first = Request(Reply(), 1, release=release)
    ref.tell(first)
    queued = [Request(Reply(), i) for i in range(3)]
    for msg in queued:
        ref.tell(msg)
    assert first.started.wait(WAIT)
    actor.stop(timeout=0)
    release.set()
    actor.stop(timeout=WAIT)
    assert first.reply.get(WAIT) == 1
    for msg in queued:
        _unavailable(msg.reply)
    assert actor.dropped == queued


# -- InlineActor is a fast path: with fast paths off it is a plain actor ---------------------------


class Where(InlineActor):
    def on_Ping(self, _msg: Ping) -> object:
        return gevent.getcurrent()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fast", [True, False])
def test_inline_actor_runs_on_the_senders_stack_only_with_fast_paths_on(actors, fast: bool) -> None:
    from triton_actor.runtime import fastpath

    before = fastpath.enabled
    fastpath.set_enabled(fast)
    try:
        actor = Where("where")
        ref = actors(actor)
    finally:
        fastpath.set_enabled(before)
    ran_in = ref.ask(Ping(0), timeout=WAIT)
    assert (ran_in is gevent.getcurrent()) is fast
    assert (actor._loop is None) is fast
    if not fast:
        assert ran_in is actor._loop
    assert ref.alive
    ref.stop(timeout=WAIT)
    assert not ref.alive
    _unavailable(ref.ask_async(Ping(0)))

"""Flow-control credits of an isolated model's streams (runtime/stream_credits.py), and the child's
stand-in channel that waits on them (backends/python/isolated_child.py ``ChildChannel``). No pipes, no
processes: the credit arithmetic by itself, then the channel with a recording fake of the process and
a thread that sends; the tests wait on the frames the channel writes (a queue, with a timeout). The
requests of one gRPC stream share one window (``SharedCredits``, keyed by the stream's account)."""

from __future__ import annotations

import queue
import random
import threading
import types

import numpy as np
import pytest
from gevent import monkey

from triton_actor.backends.python import isolation_wire as wire
from triton_actor.backends.python.isolated_child import ChildChannel, ModelProcess
from triton_actor.backends.python.isolated_session import _Session
from triton_actor.inference import InferResponse
from triton_actor.runtime.response_channel import BoundedResponseChannel, StreamAccount
from triton_actor.runtime.stream_credits import CreditReturn, SendCredit, SharedCredits, Window

_native_lock = monkey.get_original("_thread", "allocate_lock")


def test_a_sender_may_send_a_window_of_responses() -> None:
    credit = SendCredit(Window(3, None))
    for _ in range(3):
        assert credit.may_send()
        credit.spend(1000)
    assert not credit.may_send()
    credit.refund(1, 1000)
    assert credit.may_send() and (credit.responses, credit.bytes) == (2, 2000)


def test_a_byte_window_lets_one_larger_response_through_alone() -> None:
    credit = SendCredit(Window(1024, 100))
    assert credit.may_send()
    credit.spend(150)  # over the window by itself: it goes, as the server's channel lets it
    assert not credit.may_send()
    credit.refund(1, 150)
    credit.spend(60)
    credit.spend(40)  # 100: at the window, not over it
    assert credit.may_send()
    credit.spend(1)
    assert not credit.may_send()


def test_no_window_never_waits_and_a_grant_never_goes_negative() -> None:
    credit = SendCredit(None)
    for _ in range(10_000):
        credit.spend(1 << 20)
    assert credit.may_send()
    bounded = SendCredit(Window(2, 10))
    bounded.refund(5, 50)
    assert (bounded.responses, bounded.bytes) == (0, 0)


def test_grants_come_at_half_the_window_in_either_unit() -> None:
    by_count = CreditReturn(Window(8, 1 << 20))
    assert [by_count.taken(10) for _ in range(4)] == [None, None, None, (4, 40)]
    by_bytes = CreditReturn(Window(1024, 100))
    assert by_bytes.taken(30) is None and by_bytes.taken(30) == (2, 60)
    assert by_bytes.taken(500) == (1, 500)  # one large response: told at once
    one = CreditReturn(Window(1, None))  # an ensemble step's max_inflight_requests of 1
    assert one.taken(7) == (1, 7) and one.taken(0) == (1, 0)


@pytest.mark.parametrize("seed", range(20))
def test_a_waiting_sender_always_hears_once_the_client_took_everything(seed: int) -> None:
    """The model sends while it may; the client takes a random part of what arrived; grants go back.
    Whatever the sizes, the server never holds more than the window (and one response over the
    bytes), and a sender that waits is never left waiting once the client took all it was sent."""
    rng = random.Random(seed)
    window = Window(rng.choice([1, 2, 8, 1024]), rng.choice([None, 100, 4 << 20]))
    credit, grants = SendCredit(window), CreditReturn(window)
    in_flight: list[int] = []  # sent, not yet taken by the client
    sizes = [0, 1, 60, 99, 100, 150, 1 << 20]
    for _ in range(3000):
        while credit.may_send() and len(in_flight) < 5000:
            size = rng.choice(sizes)
            credit.spend(size)
            in_flight.append(size)
        assert len(in_flight) <= window.responses
        if window.bytes is not None:
            assert sum(in_flight) <= window.bytes + max(in_flight)
        for _ in range(rng.randint(0, len(in_flight))):
            grant = grants.taken(in_flight.pop(0))
            if grant is not None:
                credit.refund(*grant)
        if not in_flight:
            assert credit.may_send(), "the client took everything, yet the sender would wait"


class _FakeProcess:
    """What a ChildChannel needs of ModelProcess: its channels and the outbox (recorded); each
    ``("waiting", key, True)`` frame is also queued in :attr:`waits`, for a test to wait on."""

    def __init__(self) -> None:
        self.channels: dict[int, ChildChannel] = {}
        self.frames: list[tuple] = []
        self.waits: queue.Queue[tuple] = queue.Queue()

    def send(self, message: tuple) -> None:
        self.frames.append(message)
        if message[0] == "waiting" and message[2]:
            self.waits.put(message)

    def responses(self) -> list[tuple]:
        return [f for f in self.frames if f[0] == "response"]


def _response(nbytes: int) -> InferResponse:
    return InferResponse([("OUT", np.zeros(nbytes, np.uint8))])


def _sender(channel: ChildChannel, count: int, nbytes: int) -> threading.Thread:
    def run() -> None:
        for _ in range(count):
            channel.send(_response(nbytes), False)
        channel.send(None, True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(30)
def test_the_childs_send_waits_for_credit_and_goes_on_when_granted() -> None:
    process = _FakeProcess()
    channel = process.channels[1] = ChildChannel(process, 1, Window(4, None))
    thread = _sender(channel, 10, 8)
    assert process.waits.get(timeout=10) == ("waiting", 1, True)
    assert len(process.responses()) == 4 and process.frames[-1] == ("waiting", 1, True)
    assert [f[3:] for f in process.responses()] == [(False, 8, None)] * 4  # final, size charged, no account
    channel.grant(2, 16)
    process.waits.get(timeout=10)  # two more went, then it waits again
    assert len(process.responses()) == 6
    assert ("waiting", 1, False) in process.frames
    channel.grant(6, 48)
    thread.join(10)
    assert not thread.is_alive()
    assert len(process.responses()) == 11 and process.responses()[-1][2:] == (None, True, 0, None)
    assert 1 not in process.channels  # finished: a later grant or cancel finds nothing


@pytest.mark.timeout(30)
def test_a_cancel_releases_a_waiting_send_and_drops_what_follows() -> None:
    process = _FakeProcess()
    channel = process.channels[3] = ChildChannel(process, 3, Window(1024, 100))
    thread = _sender(channel, 50, 150)  # one response over the bytes: the second send waits
    process.waits.get(timeout=10)
    channel.cancel()
    thread.join(10)
    assert not thread.is_alive() and channel.is_cancelled()
    sent = process.responses()
    assert len(sent) == 2  # the first, and the final without outputs: the rest was dropped
    assert sent[0][3] is False and sent[1][2:] == (None, True, 0, None)
    assert process.frames[-2] == ("waiting", 3, False)


def test_a_send_after_the_final_is_dropped() -> None:
    process = _FakeProcess()
    channel = process.channels[5] = ChildChannel(process, 5, Window(1, None))
    channel.send(_response(4), True)
    channel.send(_response(4), False)  # would wait for credit that never comes: dropped instead
    channel.send(None, True)
    assert len(process.responses()) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ends", ["execute_failed", "final_from_another_thread"])
def test_a_request_that_ends_releases_a_waiting_send(ends: str) -> None:
    """``execute`` failed (the server ended the request with the error and forgot it), or another thread
    of the model sent the final response: a send waiting for credit returns, dropped."""
    process = _FakeProcess()
    channel = process.channels[7] = ChildChannel(process, 7, Window(1, None))
    thread = threading.Thread(target=lambda: [channel.send(_response(4), False) for _ in range(3)], daemon=True)
    thread.start()
    process.waits.get(timeout=10)
    if ends == "execute_failed":
        channel.finish()
    else:
        channel.send(None, True)
    thread.join(10)
    assert not thread.is_alive() and 7 not in process.channels
    assert len(process.responses()) == (1 if ends == "execute_failed" else 2)


# -- the requests of one stream share one window ------------------------------------------------------


def test_the_requests_of_an_account_share_one_window_and_others_keep_their_own() -> None:
    credits = SharedCredits()
    a, b = credits.open(Window(4, None), 1), credits.open(Window(4, None), 1)
    own = credits.open(Window(4, None), None)
    assert a is b and own is not a and len(credits) == 1
    for _ in range(4):
        assert a.may_send()
        a.spend(10)
    assert not b.may_send() and own.may_send()  # the account's window is full for both of its requests
    assert credits.grant(1, 2, 20) is a and b.may_send()
    assert credits.grant(7, 1, 1) is None  # an account it does not know (forgotten): nothing waits there


def test_an_account_is_forgotten_once_its_requests_ended_and_everything_came_back() -> None:
    credits = SharedCredits()
    credit = credits.open(Window(8, None), 3)
    credit.spend(5)
    credits.end(3)
    assert len(credits) == 1  # the server still holds one it was charged: kept, or a later request gets it twice
    credits.grant(3, 1, 5)
    assert len(credits) == 0
    fresh = credits.open(Window(8, None), 3)  # a later request of the stream: an empty window, exact
    assert fresh is not credit and (fresh.responses, fresh.users) == (0, 1)
    credits.end(3)
    assert len(credits) == 0


def test_a_release_grants_what_was_dropped_and_what_was_pending() -> None:
    grants = CreditReturn(Window(8, None))
    assert grants.taken(10) is None
    assert grants.release(3, 30) == (4, 40)  # 3 dropped unread, 1 taken not yet told
    assert grants.release(0, 0) is None  # nothing: no frame


@pytest.mark.parametrize("seed", range(20))
def test_a_shared_window_gets_back_all_it_was_charged(seed: int) -> None:
    """Requests of one account send while the shared window allows; the client takes some of what the
    server holds; some requests' channels close with responses unread, or get one after they closed.
    The server never holds more than the window, and once every request ended and every channel
    closed, the account is forgotten: nothing leaked (a leak would shrink the stream's window)."""
    rng = random.Random(seed)
    window = Window(rng.choice([1, 2, 8, 64]), rng.choice([None, 100, 4 << 20]))
    credits, grants = SharedCredits(), CreditReturn(window)
    held: dict[int, list[int]] = {}  # request → sizes the server holds for it, not yet taken
    closed: set[int] = set()
    for request in range(rng.randint(2, 12)):
        credit = credits.open(window, 9)
        held[request] = []
        for _ in range(rng.randint(0, 40)):
            if not credit.may_send():
                break
            size = rng.choice([0, 1, 60, 99, 150, 1 << 20])
            credit.spend(size)
            if request in closed:  # after its channel closed: the server grants it back at once
                credits.grant(9, 1, size)
            else:
                held[request].append(size)
            assert sum(len(sizes) for sizes in held.values()) <= window.responses
            if rng.random() < 0.1 and request not in closed:  # the client leaves this request
                dropped, held[request] = held[request], []
                closed.add(request)
                grant = grants.release(len(dropped), sum(dropped))
                if grant is not None:
                    credits.grant(9, *grant)
            for other in rng.sample(sorted(held), len(held)):  # the client takes some of anyone's
                while held[other] and rng.random() < 0.5:
                    grant = grants.taken(held[other].pop(0))
                    if grant is not None:
                        credits.grant(9, *grant)
        credits.end(9)  # its final went (not charged)
    for request in sorted(held):  # the rest is taken, then every channel closes
        for size in held[request]:
            grant = grants.taken(size)
            if grant is not None:
                credits.grant(9, *grant)
        grant = grants.release(0, 0)
        if grant is not None:
            credits.grant(9, *grant)
    assert len(credits) == 0, "the account's window was not all given back"


def _process() -> tuple[ModelProcess, list[tuple], queue.Queue[tuple]]:
    """A ModelProcess without pipes: the frames it would write are recorded (``waiting`` ones queued too)."""
    process = ModelProcess(None, None, None, None)  # type: ignore[arg-type]
    frames: list[tuple] = []
    waits: queue.Queue[tuple] = queue.Queue()

    def send(message: tuple) -> None:
        frames.append(message)
        if message[0] == "waiting" and message[2]:
            waits.put(message)

    process.send = send  # type: ignore[method-assign]
    return process, frames, waits


@pytest.mark.timeout(30)
def test_the_requests_of_a_stream_wait_together_and_a_stream_credit_releases_them() -> None:
    process, frames, waits = _process()
    window = {1: (4, None, 5), 2: (4, None, 5), 3: (4, None, None)}
    channels = [process._channel(window, key)[0] for key in (1, 2, 3)]
    threads = [_sender(channel, 6, 8) for channel in channels[:2]]
    assert {waits.get(timeout=10)[1], waits.get(timeout=10)[1]} == {1, 2}
    sent = [f for f in frames if f[0] == "response"]
    assert len(sent) == 4 and {f[5] for f in sent} == {5}  # four between them: the stream's window, once
    channels[2].send(_response(8), False)  # a request of its own: its own window, it does not wait
    credit = channels[0]._credit

    def grant_what_is_held() -> None:  # what the client took: all the server holds (nobody sends meanwhile)
        with process.shared_room:
            held = (credit.responses, credit.bytes)
        process._route(("stream_credit", 5, *held))

    grant_what_is_held()
    while any(thread.is_alive() for thread in threads):
        try:
            waits.get(timeout=0.2)  # a sender waits again: the window is full, nobody else sends now
        except queue.Empty:
            continue
        grant_what_is_held()
    grant_what_is_held()
    assert len([f for f in frames if f[0] == "response"]) == 15  # 12, 2 finals, the request of its own
    finals = [f for f in frames if f[0] == "response" and f[3]]
    assert [f[4] for f in finals] == [0, 0]  # the finals were not charged
    assert len(process.shared_credits) == 0  # both ended, all 12 granted back: forgotten


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ends", ["cancel", "execute_failed"])
def test_a_request_of_a_stream_that_ends_releases_its_waiting_send_and_leaves_the_window(ends: str) -> None:
    process, _frames, waits = _process()
    channel = process._channel({1: (2, None, 5)}, 1)[0]
    other = process._channel({2: (2, None, 5)}, 2)[0]
    thread = _sender(channel, 5, 8)
    waits.get(timeout=10)
    channel.cancel() if ends == "cancel" else channel.finish()
    thread.join(10)
    assert not thread.is_alive()
    assert len(process.shared_credits) == 1  # two still held by the server: kept for the other request
    assert not other._credit.may_send()
    process._route(("stream_credit", 5, 2, 16))  # the server dropped them when the channel closed
    assert other._credit.may_send()
    other.send(None, True)
    assert len(process.shared_credits) == 0


@pytest.mark.parametrize("with_final", [False, True])
def test_a_closing_channel_reports_what_it_dropped_unread_but_not_the_final(with_final: bool) -> None:
    """The server's side: what a stream's channel drops at close goes back to the model's process
    (``on_closed``); a response put after it closed is refused, so that its credit goes back too."""
    channel = BoundedResponseChannel(0, None, StreamAccount())
    told: list[tuple[int, int]] = []
    channel.on_closed = lambda responses, size: told.append((responses, size))
    for size in (10, 20, 30):
        assert channel.put(_response(1), False, size)
    channel.receive_sized(0)
    if with_final:
        assert channel.put(None, True, 7)
    channel.close()
    assert told == [(2, 50)]
    assert not channel.put(_response(1), False, 5)


class _Pipe:
    """The server's pipe to the model's process: the frames written from native threads; :meth:`wait`
    blocks (a lock of the OS: the writers are native threads, not greenlets) until ``want`` responses
    were granted back."""

    def __init__(self, want: int) -> None:
        self.frames: list[tuple] = []
        self._want = want
        self._done = _native_lock()
        self._done.acquire()

    def send(self, message: tuple) -> None:
        self.frames.append(message)
        if sum(f[2] for f in self.frames) == self._want:
            self._done.release()

    def wait(self) -> bool:
        return self._done.acquire(timeout=10)


@pytest.mark.timeout(30)
def test_the_server_grants_back_a_stream_response_that_arrived_after_its_channel_closed() -> None:
    """The server's reader: a response charged to a stream's account whose channel closed (or was
    forgotten) is granted back to the account at once; one of a request's own window is not (its
    window ends with it); a final never is (never charged)."""
    session = _Session.__new__(_Session)  # no process: what _deliver needs of one
    session._lock, session._channels, session._keys = threading.Lock(), {}, {}
    session._cancel_told = set()
    session._traces, session._trace_keys = {}, {}
    pipe = _Pipe(2)
    session.child = types.SimpleNamespace(to_child=types.SimpleNamespace(submit=pipe.send))
    channel = BoundedResponseChannel(0, None, StreamAccount())
    session._channels[1] = channel
    channel.close()
    session._deliver(1, wire.result_to_wire(_response(4)), False, 40, 5)  # closed: refused, granted back
    session._deliver(2, wire.result_to_wire(_response(4)), False, 10, 5)  # forgotten: granted back
    session._deliver(3, wire.result_to_wire(_response(4)), False, 10, None)  # a window of its own: not
    session._deliver(1, None, True, 0, 5)  # the final: never charged
    assert pipe.wait(), f"granted back: {pipe.frames}"
    assert {f[:2] for f in pipe.frames} == {("stream_credit", 5)} and sum(f[3] for f in pipe.frames) == 50

"""Flow-control credits of an isolated model's streams (protocol/stream_credits.py), and the child's
stand-in channel that waits on them (backends/python/isolated_child.py ``ChildChannel``). No pipes, no
processes: the credit arithmetic by itself, then the channel with a recording fake of the process and
a thread that sends; the tests wait on the frames the channel writes (a queue, with a timeout)."""

from __future__ import annotations

import queue
import random
import threading

import numpy as np
import pytest

from triton_actor.backends.python.isolated_child import ChildChannel
from triton_actor.inference import InferResponse
from triton_actor.protocol.stream_credits import CreditReturn, SendCredit, Window


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
    assert [f[3:] for f in process.responses()] == [(False, 8)] * 4  # final, size charged
    channel.grant(2, 16)
    process.waits.get(timeout=10)  # two more went, then it waits again
    assert len(process.responses()) == 6
    assert ("waiting", 1, False) in process.frames
    channel.grant(6, 48)
    thread.join(10)
    assert not thread.is_alive()
    assert len(process.responses()) == 11 and process.responses()[-1][2:] == (None, True, 0)
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
    assert sent[0][3] is False and sent[1][2:] == (None, True, 0)
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

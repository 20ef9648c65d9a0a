"""BoundedResponseChannel (runtime/response_channel.py): a producer on another thread waits at the bound
and goes on at half of it; closing or cancelling the channel releases it at once and drops what it sends
after; a producer greenlet on a thread with its own hub waits alone; the hub never waits. No sockets, no
sleeps: the tests wait on the channel's own report of a waiting producer (a bounded loop)."""

from __future__ import annotations

import gevent
import numpy as np
import pytest
from gevent import monkey

from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse, response_bytes
from triton_actor.runtime import response_channel
from triton_actor.runtime.response_channel import BoundedResponseChannel, ChannelResponses, StreamAccount

_start = monkey.get_original("_thread", "start_new_thread")
_native_lock = monkey.get_original("_thread", "allocate_lock")


def _until(condition, what: str) -> None:
    for _ in range(2000):  # 10 s at most
        if condition():
            return
        gevent.sleep(0.005)  # the wait-for helper's poll
    raise AssertionError(f"timed out waiting for {what}")


def _response(nbytes: int) -> InferResponse:
    return InferResponse([("OUT", np.zeros(nbytes, np.uint8))])


class _Producer:
    """Sends ``count`` items from a native thread without a gevent hub; counts the sends that returned."""

    def __init__(self, channel: BoundedResponseChannel, count: int, item=lambda i: i) -> None:
        self.returned = 0
        self.done = _native_lock()
        self.done.acquire()

        def run() -> None:
            try:
                for i in range(count):
                    channel.send(item(i), False)
                    self.returned += 1
                channel.send(None, True)
            finally:
                self.done.release()

        _start(run, ())

    def finished(self) -> bool:
        return not self.done.locked()


@pytest.mark.timeout(30)
def test_a_producer_waits_at_the_bound_and_goes_on_at_half_of_it() -> None:
    channel = BoundedResponseChannel(8)
    producer = _Producer(channel, 100)
    _until(lambda: channel.held[2] == 1, "the producer to wait")
    assert producer.returned == 7 and channel.held[:2] == (8, 0)  # the eighth is queued, its send waits
    for expected in range(3):
        assert channel.receive(timeout=5) == (expected, False)
    assert channel.held[2] == 1  # 5 left: more than half
    assert channel.receive(timeout=5) == (3, False)  # 4 left: it goes on
    _until(lambda: channel.held[2] == 1 and producer.returned > 7, "the producer to wait again")
    got = [channel.receive(timeout=5) for _ in range(100 - 4 + 1)]
    assert got == [(i, False) for i in range(4, 100)] + [(None, True)]
    _until(producer.finished, "the producer to finish")
    channel.close()


@pytest.mark.timeout(30)
def test_bytes_bound_lets_a_large_response_through_alone() -> None:
    channel = BoundedResponseChannel(1000, 100)
    producer = _Producer(channel, 3, item=lambda i: _response(150))
    _until(lambda: channel.held[2] == 1, "the producer to wait")
    assert producer.returned == 0 and channel.held[:2] == (1, 150)
    channel.receive(timeout=5)
    _until(lambda: producer.returned >= 1, "the producer to go on")
    for _ in range(3):
        channel.receive(timeout=5)
    _until(producer.finished, "the producer to finish")
    channel.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["close", "cancel"])
def test_closing_or_cancelling_releases_a_waiting_producer_and_drops_what_it_sends(how: str) -> None:
    channel = BoundedResponseChannel(4)
    producer = _Producer(channel, 1000)
    _until(lambda: channel.held[2] == 1, "the producer to wait")
    if how == "close":
        channel.close()
    else:
        channel.cancelled = True
    _until(producer.finished, "the producer to be released")
    assert producer.returned == 1000  # no send fails or waits any more: they go nowhere
    if how == "close":
        assert channel.held[:2] == (0, 0)
    channel.close()


@pytest.mark.timeout(30)
def test_closing_the_responses_before_the_first_one_cancels_the_request() -> None:
    channel = BoundedResponseChannel(4)
    producer = _Producer(channel, 1000)
    _until(lambda: channel.held[2] == 1, "the producer to wait")
    ChannelResponses(channel).close()  # a generator closed before it started would not have
    _until(producer.finished, "the producer to be released")
    assert channel.is_cancelled()


@pytest.mark.timeout(30)
def test_a_producer_greenlet_on_a_thread_with_its_own_hub_waits_alone() -> None:
    """A model that answers from "threads" it started (greenlets of its instance thread's hub): the one
    that waits must not stop the others."""
    channel = BoundedResponseChannel(2)
    ticks: list[int] = []
    done = _native_lock()
    done.acquire()

    def thread_main() -> None:
        try:
            # a greenlet of this thread's hub, as a model's gevent "thread" is (whatever the patching)
            sender = gevent.spawn(lambda: [channel.send(i, False) for i in range(10)])
            for i in range(50):
                ticks.append(i)
                gevent.sleep(0)  # this thread's hub runs its other greenlets meanwhile
            sender.join()
        finally:
            done.release()

    _start(thread_main, ())
    _until(lambda: len(ticks) == 50, "the other greenlet to run while the sender waits")
    assert channel.held[2] == 1
    got = [channel.receive(timeout=5)[0] for _ in range(10)]
    assert got == list(range(10))
    _until(lambda: not done.locked(), "the thread to end")
    channel.close()


def test_the_hub_never_waits() -> None:
    channel = BoundedResponseChannel(1)
    for i in range(10):
        channel.send(i, False)  # the hub thread: queued, never waits
    assert channel.held == (10, 0, 0)
    channel.close()


def test_response_bytes() -> None:
    assert response_bytes(None) == 0
    assert response_bytes(InferResponse([("A", np.zeros((4, 4), np.float32)), ("B", np.zeros(3, np.int64))])) == 88
    text = np.array([b"x" * 100] * 1000, dtype=np.object_)
    assert response_bytes(InferResponse([("T", text)])) == 108 * 1000  # sampled: all alike here


@pytest.mark.timeout(30)
def test_each_response_is_sized_once_where_it_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that keeps its own account (the BLS pump) takes the size the channel measured in
    ``send()``: before, the pump measured every response again."""
    measured = []
    monkeypatch.setattr(response_channel, "response_bytes", lambda item: measured.append(item) or 7 * len(measured))
    channel = BoundedResponseChannel(8, 1 << 20)
    first, second = _response(3), _response(5)
    channel.send(first, False)
    channel.send(second, True)
    responses = ChannelResponses(channel)
    assert responses.next_sized() == (first, False, 7)
    assert next(responses) == (second, True)  # the plain iterator still yields pairs
    assert measured == [first, second] and channel.held[:2] == (0, 0)
    with pytest.raises(StopIteration):
        responses.next_sized()


@pytest.mark.timeout(30)
def test_put_never_waits_and_tells_what_was_taken() -> None:
    """An isolated model's reader thread puts (its process keeps the bound with credits): nothing waits,
    even far past the bound; each response taken is told with the size its producer counted."""
    channel = BoundedResponseChannel(2, 100)
    taken: list[tuple[int, bool]] = []
    channel.on_taken = lambda size, final: taken.append((size, final))
    done = _native_lock()
    done.acquire()

    def run() -> None:
        for i in range(5):
            channel.put(i, False, 70)
        channel.put(None, True, 0)
        done.release()

    _start(run, ())
    _until(lambda: not done.locked(), "the puts to return")
    assert channel.held == (6, 350, 0)
    channel.remote_waiting = True  # the producer said its send waits for credit
    assert channel.held[2] == 1
    got = [channel.receive(timeout=5) for _ in range(6)]
    assert got == [(i, False) for i in range(5)] + [(None, True)]
    assert taken == [(70, False)] * 5 + [(0, True)]
    assert channel.window == (2, 100)
    channel.close()


@pytest.mark.timeout(30)
def test_the_channels_of_a_stream_share_its_account() -> None:
    """Two requests of one stream: what one holds counts against the other's producer; the consumer
    of either making room wakes both; a channel closed with responses in it gives them back at once."""
    account = StreamAccount(8, 1 << 20)
    first, second = BoundedResponseChannel(1000, 1 << 30, account), BoundedResponseChannel(1000, 1 << 30, account)
    a = _Producer(first, 6)
    _until(a.finished, "the first producer to send 6 and its final")
    b = _Producer(second, 100)
    _until(lambda: second.held[2] == 1, "the second producer to wait at the stream's bound")
    assert second.held[0] == 1 and (account.count, account.bytes) == (8, 0)  # 6 + the final + its first
    assert [first.receive(timeout=5) for _ in range(4)] == [(i, False) for i in range(4)]  # 4 left: half
    _until(lambda: b.returned > 0, "the second producer to be woken by the first's consumer")
    _until(lambda: second.held[2] == 1, "the second producer to wait again")
    first.close()  # the three it held leave the account at once
    assert account.count == second.held[0] == 5 and len(account.channels) == 1
    assert second.receive(timeout=5) == (0, False)  # 4 left: room, the producer goes on
    _until(lambda: b.returned > 5, "the second producer to be woken")
    second.close()
    _until(b.finished, "the second producer to finish (its channel closed)")
    assert account.count == 0 and not account.channels


def _assert_ended_cancelled(channel: BoundedResponseChannel, queued: int) -> None:
    """What a stalled channel holds: the responses queued before the stall, then a CANCELLED final."""
    assert channel.is_cancelled() and channel.held[2] == 0
    got = [channel.receive(timeout=5) for _ in range(queued + 1)]
    assert got[:queued] == [(i, False) for i in range(queued)]
    error, final = got[-1]
    assert final and isinstance(error, TritonError) and error.code == Code.CANCELLED
    channel.close()


@pytest.mark.timeout(30)
def test_a_producer_whose_consumer_takes_nothing_for_the_stall_ends_the_request() -> None:
    """A client that stopped reading frees the model: its waiting send returns after ``stall`` s with
    nothing taken, later ones are dropped, and the stream ends CANCELLED after what it held."""
    channel = BoundedResponseChannel(4, stall=0.05)
    producer = _Producer(channel, 1000)
    _until(producer.finished, "the stalled producer to be released")
    assert producer.returned == 1000  # the rest went nowhere, as for a client that left
    _assert_ended_cancelled(channel, 4)


@pytest.mark.timeout(30)
def test_a_producer_greenlet_whose_consumer_takes_nothing_for_the_stall_ends_the_request() -> None:
    channel = BoundedResponseChannel(2, stall=0.05)
    done = _native_lock()
    done.acquire()

    def thread_main() -> None:
        try:
            # a greenlet of this thread's hub: it waits on a watcher, with the stall's timeout
            sender = gevent.spawn(lambda: [channel.send(i, False) for i in range(10)])
            sender.join()
        finally:
            done.release()

    _start(thread_main, ())
    _until(lambda: not done.locked(), "the stalled greenlet to be released")
    _assert_ended_cancelled(channel, 2)


def test_a_remote_producer_whose_consumer_takes_nothing_for_the_stall_is_cancelled() -> None:
    """An isolated model's send waits for credit in its own process and says so every ``stall_look`` s
    (``remote_wait``): five looks with nothing taken cancel the request as an in-process producer's
    timed-out waits do, and its process is told (``on_cancel``) once; a look after the client took a
    response starts the count again."""
    channel = BoundedResponseChannel(4, stall=10.0)
    told: list[bool] = []
    channel.on_cancel = lambda: told.append(True)
    assert channel.stall_look == 2.0
    for i in range(4):
        channel.put(i, False, 0)
    channel.remote_wait(True)  # starts to wait
    for _ in range(4):
        channel.remote_wait(True)
    channel.receive(timeout=5)  # the client took one: the next look sees progress
    for _ in range(5):
        channel.remote_wait(True)
    assert not channel.is_cancelled() and told == [] and channel.held[2] == 1
    channel.remote_wait(True)  # the fifth look in a row with nothing taken
    assert channel.is_cancelled() and told == [True]
    channel.remote_wait(True)
    channel.remote_wait(False)  # its send returned
    assert told == [True]
    got = [channel.receive(timeout=5) for _ in range(4)]
    assert got[:3] == [(i, False) for i in range(1, 4)]
    assert got[-1][1] and isinstance(got[-1][0], TritonError) and got[-1][0].code == Code.CANCELLED
    channel.close()


def test_a_remote_producer_of_a_consumer_with_no_stall_waits_as_long_as_it_lives() -> None:
    """A BLS caller or an ensemble's step has no stall: looks never cancel (and none are asked for)."""
    channel = BoundedResponseChannel(4)
    assert channel.stall_look is None
    for _ in range(20):
        channel.remote_wait(True)
    assert not channel.is_cancelled()
    channel.close()

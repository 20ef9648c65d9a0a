"""runtime/threads.py: native locks and events whatever the patching, and the one writer per pipe."""

from __future__ import annotations

import os
import types

import pytest

from triton_actor.backends.python.frame_pipe import FrameReader, FrameWriter
from triton_actor.backends.python.isolated_session import _Session
from triton_actor.runtime.threads import NativeCondition, NativeEvent, SerialWriter, native_lock, start_native_thread


class _Sink:
    """What a SerialWriter writes to: ``gate`` (a native lock, held) stalls every write until released."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.items: list[object] = []
        self.closed = False
        self.gate = native_lock()
        self.fail_at = fail_at
        self.writing = NativeEvent()

    def write(self, item: object) -> None:
        self.writing.set()
        with self.gate:
            if self.fail_at is not None and len(self.items) == self.fail_at:
                raise BrokenPipeError("the reader is gone")
            self.items.append(item)

    def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(20)
def test_items_are_written_in_submission_order_and_a_stalled_sink_never_stalls_a_submitter() -> None:
    sink = _Sink()
    sink.gate.acquire()  # a full pipe: the first write waits
    writer = SerialWriter("test", sink.write, sink.close)
    writer.submit(0)
    assert sink.writing.wait(5)
    for i in range(1, 1000):
        writer.submit(i)  # returns at once: the writer's thread is the one that waits
    writer.close()
    assert not writer.stopped.wait(0.05)
    sink.gate.release()
    assert writer.stopped.wait(5)
    assert sink.items == list(range(1000)) and sink.closed
    with pytest.raises(BrokenPipeError):
        writer.submit(1000)


@pytest.mark.timeout(20)
def test_submissions_of_several_threads_keep_each_threads_order() -> None:
    sink = _Sink()
    writer = SerialWriter("test", sink.write, sink.close)
    done = [NativeEvent() for _ in range(4)]

    def submit(thread: int) -> None:
        for i in range(500):
            writer.submit((thread, i))
        done[thread].set()

    for thread in range(4):
        start_native_thread(submit, thread)
    assert all(event.wait(10) for event in done)
    writer.close()
    assert writer.stopped.wait(10)
    for thread in range(4):
        assert [i for t, i in sink.items if t == thread] == list(range(500))


@pytest.mark.timeout(20)
def test_a_failed_write_drops_what_follows_and_refuses_new_items() -> None:
    sink = _Sink(fail_at=2)
    writer = SerialWriter("test", sink.write, sink.close)
    for i in range(5):
        writer.submit(i)
    writer.close()
    assert writer.stopped.wait(5)
    assert sink.items == [0, 1] and isinstance(writer.broken, BrokenPipeError) and sink.closed


@pytest.mark.timeout(20)
def test_frames_through_a_serial_writer_arrive_whole_and_in_order_and_close_ends_the_pipe() -> None:
    read_fd, write_fd = os.pipe()
    pipe = FrameWriter(write_fd)
    writer = SerialWriter("test", pipe.send, pipe.close)
    frames = [("credit", key, 1, b"x" * (key * 1000)) for key in range(200)]  # more than a pipe holds
    for frame in frames:
        writer.submit(frame)
    writer.close()
    reader = FrameReader(read_fd)
    got = []
    while (message := reader.next_message(timeout=10)) is not None:
        got.append(tuple(message))
    reader.close()
    assert got == frames
    assert writer.stopped.wait(5)


@pytest.mark.timeout(20)
def test_native_event_and_condition_wake_native_threads_and_time_out() -> None:
    event = NativeEvent()
    assert not event.wait(0.01) and not event.is_set()
    woken = NativeEvent()
    start_native_thread(lambda: event.wait() and woken.set())
    event.set()
    assert woken.wait(5) and event.wait(0)
    cond = NativeCondition()
    with cond:
        assert not cond.wait(0.01)
    state = []

    def notify() -> None:
        with cond:
            state.append(1)
            cond.notify_all()

    with cond:
        start_native_thread(notify)
        while not state:
            assert cond.wait(5)


def test_a_cancelled_requests_released_credit_goes_after_its_cancel() -> None:
    """The hub closes a cancelled request's channel of a stream's account: the child must see the cancel
    before the credit, or the request's waiting send goes on. Both go through the one writer, in order."""
    sent: list[tuple] = []
    session = _Session.__new__(_Session)  # no process: what the hub's callbacks need of one
    session._lock, session._channels, session._keys, session._cancel_told = native_lock(), {}, {}, set()
    session.child = types.SimpleNamespace(to_child=types.SimpleNamespace(submit=sent.append))
    channel = types.SimpleNamespace(is_cancelled=lambda: True)
    session._channels[7] = channel
    credits = types.SimpleNamespace(release=lambda responses, size: (responses, size))
    session._released(7, 3, credits, 2, 50)
    session._cancel_once(7)  # the channel's on_cancel after: told once only
    assert sent == [("cancel", 7), ("stream_credit", 3, 2, 50)]

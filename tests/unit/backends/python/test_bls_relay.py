"""A decoupled BLS stream read by an isolated model: the server's relay (backends/python/bls_relay.py) and
the model process's iterator and cancels (isolated_child_bls.py), each against a recording fake of the
other side. No pipes, no processes, no server."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest

from triton_actor.backends.python import isolation_wire as wire
from triton_actor.backends.python import triton_python_backend_utils as pb_utils
from triton_actor.backends.python.bls_relay import BlsRelay
from triton_actor.backends.python.isolated_child_bls import BlsStreams, StreamedResponses


def _response(i: int) -> Any:
    return pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([i], np.int32))])


def _index(response: Any) -> int:
    return int(response.output_tensors()[0].as_numpy()[0])


class _Streams(BlsStreams):
    """The process's streams, recording what they send and the cancels queued for the canceller."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.later: list[int] = []
        super().__init__(self.sent.append, {})

    def cancel_later(self, call_id: int) -> None:
        self.later.append(call_id)


def _stream(streams: _Streams, frames: list[Any]) -> StreamedResponses:
    waiter: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for frame in frames:
        waiter.put(frame)
    streams._waiters[7] = waiter
    streams.on_frame("call_stream", 7)  # (as the reader thread notes it)
    return StreamedResponses(streams, 7, waiter)


def _items(n: int, size: int) -> list[Any]:
    return [("call_item", 7, wire.pb_response_to_wire(_response(i)), size) for i in range(n)]


def test_the_model_gives_back_what_it_took_at_half_the_window() -> None:
    process = _Streams()
    stream = _stream(process, [("call_stream", 7, 8, 1 << 20), *_items(9, 10), ("call_end", 7)])
    assert [_index(r) for r in stream] == list(range(9))
    assert process.sent == [("call_taken", 7, 4, 40), ("call_taken", 7, 4, 40)]  # the 9th: under half, untold
    assert 7 not in process._waiters
    del stream
    assert process.later == []  # read to the end: nothing to cancel


def test_the_bytes_half_of_the_window_is_given_back_too() -> None:
    process = _Streams()
    stream = _stream(process, [("call_stream", 7, 1024, 100), *_items(3, 30)])
    assert [_index(next(stream)) for _ in range(3)] == [0, 1, 2]
    assert process.sent == [("call_taken", 7, 2, 60)]


def test_cancel_tells_the_server_once_and_stops_yielding() -> None:
    process = _Streams()
    stream = _stream(process, [("call_stream", 7, 8, None), *_items(5, 1)])
    assert _index(next(stream)) == 0
    stream.cancel()
    stream.cancel()
    assert process.sent == [("call_cancel", 7)] and list(stream) == [] and 7 not in process._waiters
    del stream
    assert process.later == []


def test_an_iterator_dropped_unread_queues_its_cancel() -> None:
    process = _Streams()
    stream = _stream(process, [("call_stream", 7, 8, None), *_items(5, 1)])
    next(stream)
    del stream  # (a __del__ may run inside a frame write: it only queues)
    assert process.later == [7] and process.sent == [] and 7 not in process._waiters


def test_an_error_before_the_stream_is_raised_as_in_process() -> None:
    stream = _stream(_Streams(), [("call_reply", 7, ("raise", "Model 'x' is not ready."))])
    with pytest.raises(pb_utils.TritonModelException, match="not ready"):
        next(stream)


class _Iterator:
    """server_calls.ResponseIterator as the relay uses it."""

    def __init__(self, items: list[tuple[Any, int]]) -> None:
        self.items = items
        self.taken: list[tuple[int, int]] = []
        self.stopped = 0

    def next_sized(self) -> tuple[Any, int]:
        if not self.items:
            raise StopIteration
        return self.items.pop(0)

    def took(self, responses: int, size: int) -> None:
        self.taken.append((responses, size))

    def stop(self) -> None:
        self.stopped += 1


class _Pipe:
    def __init__(self, fail_at: int | None = None, on_send: Any = None) -> None:
        self.frames: list[Any] = []
        self.fail_at = fail_at
        self.on_send = on_send

    def send(self, frame: Any) -> None:
        if len(self.frames) == self.fail_at:
            raise BrokenPipeError("gone")
        self.frames.append(frame)
        if self.on_send is not None:
            self.on_send(frame)


def test_the_relay_sends_the_window_then_each_response_with_its_size_then_the_end() -> None:
    pipe, done = _Pipe(), []
    responses = _Iterator([(_response(0), 11), (_response(1), 12)])
    relay = BlsRelay(pipe.send, 3, responses, done.append)
    relay.run()
    kinds = [(f[0], f[-1]) if f[0] == "call_item" else f for f in pipe.frames]
    assert kinds == [("call_stream", 3, 1024, 4 << 20), ("call_item", 11), ("call_item", 12), ("call_end", 3)]
    assert done == [3] and responses.stopped == 0
    relay.took(2, 23)
    assert responses.taken == [(2, 23)]  # the model's credits: the pump's count, not what was forwarded


def test_a_cancel_stops_the_relay_and_the_target() -> None:
    responses = _Iterator([(_response(i), 1) for i in range(5)])
    relay: BlsRelay

    def cancel_after_the_first(frame: Any) -> None:
        if frame[0] == "call_item":
            relay.cancel()

    pipe, done = _Pipe(on_send=cancel_after_the_first), []
    relay = BlsRelay(pipe.send, 3, responses, done.append)
    relay.run()
    assert [f[0] for f in pipe.frames] == ["call_stream", "call_item"]
    assert responses.stopped == 1 and done == [3]


def test_a_process_gone_stops_the_target() -> None:
    responses, done = _Iterator([(_response(i), 1) for i in range(5)]), []
    BlsRelay(_Pipe(fail_at=2).send, 3, responses, done.append).run()
    assert responses.stopped == 1 and done == [3]


class _Inbox:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def get(self) -> Any:
        return self.items.pop(0)

    def close(self) -> None:
        pass


def test_the_server_iterator_counts_what_the_relay_forwards_only_when_the_model_took_it() -> None:
    from triton_actor.inference import InferResponse
    from triton_actor.plane.calls_from_models import _END, ResponseIterator, _Reading

    reading = _Reading()
    items = [(InferResponse([("INDEX", np.array([i], np.int32))]), False, 100 + i) for i in range(3)]
    iterator = ResponseIterator(_Inbox([*items, _END]), None, reading)  # type: ignore[arg-type]
    response, size = iterator.next_sized()
    assert _index(response) == 0 and size == 100 and (reading.count, reading.bytes) == (0, 0)
    iterator.took(1, 100)
    assert (reading.count, reading.bytes) == (1, 100)
    assert _index(next(iterator)) == 1 and (reading.count, reading.bytes) == (2, 201)  # a reader here counts itself
    iterator.stop()
    assert reading.cancelled  # the pump closes the stream at the target's next response
    assert iterator.next_sized()[1] == 102
    with pytest.raises(StopIteration):
        iterator.next_sized()


class _Outbox:
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def send(self, frame: Any) -> None:
        self.frames.append(frame)


def test_a_cancel_waits_for_its_stream_to_start_so_that_it_never_overtakes_the_call() -> None:
    """The call may have gone on the replies pipe and the cancel on the outbox: the server might read the
    cancel first, before it holds the stream, and drop it. So the process sends it only once the
    stream's first frame came (which the server sends once it holds the stream)."""
    from triton_actor.backends.python.isolated_child import ModelProcess

    outbox = _Outbox()
    process = ModelProcess(None, None, None, outbox)  # type: ignore[arg-type]
    early: queue.SimpleQueue[Any] = queue.SimpleQueue()
    process.waiters[5] = early
    process.bls_streams.cancel(5)  # before its call_stream: kept
    assert outbox.frames == []
    process._route(("call_stream", 5, 8, None))
    assert outbox.frames == [("call_cancel", 5)] and early.empty()  # sent now; the frame is dropped
    process._route(("call_stream", 6, 8, None))
    process.bls_streams.cancel(6)  # started: sent at once
    process._route(("call_end", 6))
    process.bls_streams.cancel(7)
    process._route(("call_reply", 7, ("raise", "not ready")))  # it never started: forgotten
    assert outbox.frames == [("call_cancel", 5), ("call_cancel", 6)]
    assert process.bls_streams._started == set() and process.bls_streams._cancel_at_start == set()


def test_a_response_that_cannot_be_sent_ends_the_models_stream_with_an_error() -> None:
    """Found by review: only OSError was caught, so any other failure (a response the wire cannot carry)
    ended the relay thread without a frame, and the model's iterator waited for ever."""
    responses, done = _Iterator([(_response(0), 1), (object(), 1), (_response(2), 1)]), []
    pipe = _Pipe()
    BlsRelay(pipe.send, 3, responses, done.append).run()
    assert [f[0] for f in pipe.frames] == ["call_stream", "call_item", "call_reply"]
    assert pipe.frames[-1][2][0] == "raise" and "BLS stream failed" in pipe.frames[-1][2][1]
    assert responses.stopped == 1 and done == [3]

"""Decoupled BLS streams in an isolated model's process: what ``exec(decoupled=True)`` returns there (and
awaiting ``async_exec(decoupled=True)`` gives), and the credits and cancels it owes the server.

The server relays the target's responses (``bls_relay.py``): ``("call_stream", id, responses, bytes)``
(the window), ``("call_item", id, response, size)`` ..., ``("call_end", id)``, and sends on only while the
model has not taken that window, so the target's ``send()`` waits beyond it, as in-process. The model's
iterator (:class:`StreamedResponses`) tells what it took, ``("call_taken", id, responses, bytes)``, once
half the window was (``protocol/stream_credits.CreditReturn``, in the sizes the server sent), and its
``cancel()`` or its being dropped unread cancels the target, ``("call_cancel", id)``.

A cancel goes out only once the stream's ``call_stream`` came: the call may have gone on the replies pipe
and the cancel goes on the outbox, so the server might read the cancel first, before it holds the
stream, and drop it (:class:`BlsStreams` keeps it until then, or forgets it at a ``call_reply``).

Threads: :meth:`BlsStreams.open`, ``next()`` and ``cancel()`` on the model's threads; :meth:`BlsStreams.on_frame`
on the process's reader thread; ``StreamedResponses.__del__`` on any thread, at any point (a garbage
collection, maybe inside a frame write whose lock it would need), so it only queues its cancel for the
``isolation-bls-cancels`` thread (started at the first stream; ``SimpleQueue.put`` is safe there).
Owner: one :class:`BlsStreams` per process (``isolated_child.ModelProcess``), its sets under its lock.
Failure: none of its own; what the server refuses arrives as a ``call_reply`` and is raised as in-process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ...runtime.stream_credits import CreditReturn, Window
from . import isolation_wire as wire


class BlsStreams:
    """The process's decoupled BLS streams: which started, cancels waiting for their start, the cancels of
    iterators dropped unread and the thread that sends those."""

    def __init__(self, send: Callable[[Any], None], waiters: dict[int, Any]) -> None:
        self.send = send  # the outbox: credits and cancels go there whatever the model is doing
        self._waiters = waiters  # the process's call waiters, by call id
        self._lock = threading.Lock()  # the sets and the flag: the model's threads and the reader
        self._started: set[int] = set()  # streams whose call_stream came, until their end
        self._cancel_at_start: set[int] = set()  # ... cancelled before it came
        self._dropped: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._canceller = False

    def open(self, call_id: int, waiter: queue.SimpleQueue[Any]) -> StreamedResponses:
        """A model's thread, once the call went out: its iterator."""
        with self._lock:
            start, self._canceller = not self._canceller, True
        if start:
            threading.Thread(target=self._send_dropped, name="isolation-bls-cancels", daemon=True).start()
        return StreamedResponses(self, call_id, waiter)

    def forget(self, call_id: int) -> None:
        """What the reader thread gets for the stream from now on is dropped."""
        self._waiters.pop(call_id, None)

    def cancel(self, call_id: int) -> None:
        """A model's thread (or the canceller): the stream was cancelled; told now if it started."""
        with self._lock:
            started = call_id in self._started
            if not started:
                self._cancel_at_start.add(call_id)
        if started:
            self.send(("call_cancel", call_id))

    def cancel_later(self, call_id: int) -> None:
        """Any thread, even inside a garbage collection: :meth:`cancel` on the canceller thread."""
        self._dropped.put(call_id)

    def _send_dropped(self) -> None:
        while True:
            self.cancel(self._dropped.get())

    def on_frame(self, kind: str, call_id: int) -> bool:
        """Reader thread, for a call's frame other than ``call_item``: note a stream starting or ending;
        False for a ``call_stream`` cancelled already (its cancel is sent now, the frame dropped)."""
        with self._lock:
            if kind != "call_stream":  # call_end, call_reply: nothing more comes for it
                self._started.discard(call_id)
                self._cancel_at_start.discard(call_id)
                return True
            cancelled = call_id in self._cancel_at_start
            if cancelled:
                self._cancel_at_start.discard(call_id)
            else:
                self._started.add(call_id)
        if cancelled:
            self.send(("call_cancel", call_id))
        return not cancelled


class StreamedResponses:
    """The target's responses as the server relays them; ``cancel()``, or the iterator dropped unread,
    cancels the target (it sees ``is_cancelled()`` at its next response; what was in flight is dropped).
    ``next()`` on the model's thread that reads it; the reader thread fills the queue."""

    def __init__(self, streams: BlsStreams, call_id: int, waiter: queue.SimpleQueue[Any]) -> None:
        self._streams = streams
        self._id = call_id
        self._waiter = waiter
        self._credits: CreditReturn | None = None  # from the stream's first frame
        self._done = False

    def __iter__(self) -> StreamedResponses:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        message = self._waiter.get()
        if message[0] == "call_stream":
            self._credits = CreditReturn(Window(message[2], message[3]))
            message = self._waiter.get()
        if message[0] == "call_item":
            grant = None if self._credits is None else self._credits.taken(message[3])
            if grant is not None:
                self._streams.send(("call_taken", self._id, *grant))
            return wire.pb_response_from_wire(message[2])
        self._end()
        if message[0] == "call_reply":
            wire.call_answer(message)
        raise StopIteration

    def _end(self) -> None:
        self._done = True
        self._streams.forget(self._id)

    def cancel(self) -> None:
        """Stop yielding; the target is cancelled (nothing to tell once the stream ended)."""
        if not self._done:
            self._end()
            self._streams.cancel(self._id)

    def __del__(self) -> None:
        if not self._done:  # dropped unread
            self._end()
            self._streams.cancel_later(self._id)

"""Responses of one streaming request, from the thread that produces them to the greenlet that sends them.

Part of the thread bridge (:mod:`.bridge`): a decoupled model's ``response_sender.send()`` runs on its
instance's native thread (or a thread the model started, or an isolated model's reader), the front end
that writes the responses runs in a greenlet on the hub. :class:`ResponseChannel` carries them without a
bound (warmup, which reads only after ``execute`` returned); :class:`BoundedResponseChannel` is what a
client's stream gets (``DataPlane.infer_stream``): once the responses not yet taken by the front end
reach :data:`STREAM_MAX_RESPONSES` or :data:`STREAM_MAX_BYTES`, the producer's ``send()`` waits until the
front end took them down to half of that, and a client's stream that takes none for :data:`STREAM_STALL_SECS`
meanwhile is cancelled (a model waiting on it held its instance until the 60 s send timeout; an isolated
model's producer, waiting in its own process, says it still waits: :meth:`~BoundedResponseChannel.remote_wait`).
The front end takes the next response only once it wrote the
last one (gRPC: within the stream's flow-control window; HTTP: into the socket), so a client that stops
reading stops the model, as grpc-go's ``Send`` blocks on flow control; before, a client advertising a
zero window made the server hold every response the model sent (800 x 1 MiB: RSS 422 -> 1222 MB).

When the front end is done with the channel (the client went away or reset the stream, ``window_timeout``,
a cancellation) it cancels and closes it: a waiting producer returns at once, and what it sends after is
dropped, as Triton's python backend does for a cancelled request (``send()`` succeeds, the response goes
nowhere; the model sees ``is_cancelled()``). The final response never waits; a sender on the hub thread
never waits either (it would stop the hub): the ensemble's reader greenlets wait with
:meth:`BoundedResponseChannel.wait_for_room` instead. Nor does an isolated model's reader thread, which
carries every request of its process: it queues with :meth:`~BoundedResponseChannel.put`, which never
waits; the model's process keeps the bound with credits (``runtime/stream_credits.py``), told what the
consumer took through :attr:`~BoundedResponseChannel.on_taken`.

The requests of one gRPC ``ModelStreamInfer`` call share one bound (:class:`StreamAccount`): all of a
stream's responses go out through one HTTP/2 stream, so a client that stops reading it stops them all, and
a bound per request let a stream of 128 requests hold 128 times it (512 MiB, and 128 such streams on a
connection). Each request may still take the whole of its stream's bound. An isolated model's requests
of one stream share one credit window in its process (keyed by the account: ``isolated.py``), told what
any of them took through ``on_taken`` and what a closing channel dropped unread through ``on_closed``.

Threads: ``send`` from any thread; ``receive``, ``close`` and the ``cancelled`` setter in the consumer's
greenlet on the hub (where the channel is created). A waiting producer blocks its native thread on a lock
of the OS, or, on a thread that has a gevent hub of its own (the model started "threads" there), only its
greenlet, so the model's other greenlets keep running.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event

from ..errors import Code, TritonError
from ..inference import response_bytes
from .stream_credits import Window
from .stream_waiters import HubWaiter, LockWaiter
from .stream_waiters import waiter as stream_waiter
from .threads import native_lock
from .threads import native_thread_id as _get_ident

STREAM_MAX_RESPONSES = 1024  # responses of one request a client's stream holds before the model's send() waits
STREAM_MAX_BYTES = 4 << 20  # or bytes of their outputs (a larger response is let through alone)
# seconds a client's stream may take nothing while its model's send() waits at the bound: then the
# request is cancelled, so a client that stopped reading frees the model's instance (it held it until
# the 60 s send timeout) and a slow one, taking a response now and then, is never cut
STREAM_STALL_SECS = 10.0
_STALL_STEPS = 5
Item = tuple[Any, bool]  # (InferResponse | TritonError | None, final)


class OpenStreams:
    """The bounded channels of one server not yet closed, and what they hold (``/status.json``'s
    ``streams``). The ``Server`` makes one and hands it to the data plane and the ensembles, so two
    servers in one process count their own. Hub thread: channels join when made and leave when closed;
    a channel nobody closed is not kept for ever (the set is weak)."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: weakref.WeakSet[BoundedResponseChannel] = weakref.WeakSet()

    def add(self, channel: BoundedResponseChannel) -> None:
        self._open.add(channel)

    def discard(self, channel: BoundedResponseChannel) -> None:
        self._open.discard(channel)

    def totals(self) -> dict[str, int]:
        """What the channels hold now (hub thread)."""
        held = [c.held for c in list(self._open)]
        return {"open": len(held), "responses": sum(h[0] for h in held), "bytes": sum(h[1] for h in held),
                "waiting_senders": sum(h[2] for h in held), "max_responses": STREAM_MAX_RESPONSES,
                "max_bytes": STREAM_MAX_BYTES}


class ResponseChannel:
    """Responses of one streaming request, from whichever thread produces them to one greenlet.

    ``send(item, final)`` may be called from any thread (a model's native thread, a thread the model
    started, or the hub); the consumer greenlet iterates with :meth:`receive`. Items after the final
    one, or after :meth:`close`, are dropped. Create it in the hub thread; :meth:`close` (consumer side)
    releases the watcher and what was not received. ``cancelled`` is set by the consumer when its
    client went away; producers read it, and one that must be told (a model in a process of its own)
    sets :attr:`on_cancel`, called where ``cancelled`` turns true (the hub: it must not block).
    """

    __slots__ = ("_items", "_wake", "_event", "_final_sent", "_cancelled", "_closed", "_send_lock", "on_cancel")

    def __init__(self) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._event = gevent.event.Event()
        self._wake = gevent.get_hub().loop.async_()
        self._wake.start(self._event.set)
        self._final_sent = False
        self._closed = False
        self._cancelled = False
        self.on_cancel: Callable[[], None] | None = None
        self._send_lock = native_lock()  # senders may race on several threads, and with close()

    @property
    def window(self) -> Window | None:
        """The bound of what a producer may have sent and the consumer not taken (None: none)."""
        return None

    @property
    def account(self) -> StreamAccount | None:
        """The bound it shares with the other requests of its stream (None: none, or one of its own)."""
        return None

    def put(self, item: Any, final: bool, _size: int) -> bool:
        """Any thread: queue without ever waiting (this channel never does); True (it has no credits)."""
        self.send(item, final)
        return True

    def send(self, item: Any, final: bool) -> None:
        """Any thread: queue one response (or error, or None for a flags-only final)."""
        with self._send_lock:
            if self._final_sent or self._closed:
                return
            if final:
                self._final_sent = True
            self._items.append((item, final))
            self._wake.send()  # under the lock: close() cannot free the watcher meanwhile

    @property
    def finished(self) -> bool:
        return self._final_sent

    def is_cancelled(self) -> bool:
        return self._cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancelled = value
        on_cancel = self.on_cancel
        if value and on_cancel is not None:
            self.on_cancel = None  # told once
            on_cancel()
        if value:
            self._release()

    def receive(self, timeout: float | None = None) -> Item:
        """Consumer greenlet: the next ``(item, final)``; raises ``gevent.Timeout`` after ``timeout`` s."""
        items, event = self._items, self._event
        while not items:
            event.clear()
            if items:
                break
            if not event.wait(timeout):
                raise gevent.Timeout(timeout)
        return items.popleft()

    def receive_sized(self, timeout: float | None = None) -> tuple[Any, bool, int]:
        """Like :meth:`receive`, with the item's size as the channel counted it (:func:`response_bytes`,
        measured once, in ``send``; 0 where the channel counts no bytes)."""
        item, final = self.receive(timeout)
        return item, final, 0

    def wait_for_room(self) -> None:
        """Return when the channel may take more (at once: this one has no bound)."""

    def close(self) -> None:
        """Consumer side: nothing more is received; what was not, and what is sent from now on, is dropped."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self._wake.close()
            self._items.clear()
        self._release()

    def _release(self) -> None:
        """The consumer is gone (closed or cancelled): producers must not wait for it."""


class StreamAccount:
    """What the channels of one client stream hold together, against one bound: ``max_count`` responses
    or ``max_bytes`` of outputs. Counts change under :attr:`lock` (senders on any thread, the consumers);
    the set of channels is the hub's (created and closed there), so a consumer that made room wakes
    the producers waiting on any of them."""

    __slots__ = ("max_count", "max_bytes", "count", "bytes", "taken", "lock", "channels", "__weakref__")

    def __init__(self, max_count: int = 0, max_bytes: int | None = None) -> None:
        self.max_count = max(1, max_count or STREAM_MAX_RESPONSES)
        self.max_bytes = STREAM_MAX_BYTES if max_bytes is None else max_bytes
        self.count = 0
        self.bytes = 0
        self.taken = 0  # responses the consumers took, ever (progress, for a stalled stream)
        self.lock = native_lock()
        self.channels: weakref.WeakSet[BoundedResponseChannel] = weakref.WeakSet()

    def add(self, count: int, size: int) -> None:
        with self.lock:
            self.count += count
            self.bytes += size

    def over(self) -> bool:
        return self.count >= self.max_count or self.bytes > self.max_bytes

    def has_room(self) -> bool:
        return self.count <= self.max_count // 2 and self.bytes <= self.max_bytes // 2

    def wake_all(self) -> None:
        """Hub: room was made; every producer waiting on a channel of this stream goes on."""
        for channel in list(self.channels):
            if channel._waiters:
                channel._wake_waiters()


class BoundedResponseChannel(ResponseChannel):
    """A :class:`ResponseChannel` whose producer waits while ``max_count`` responses (or more than
    ``max_bytes`` of outputs) are not yet received, until they are down to half of that: a producer
    faster than its consumer cannot fill memory. Used for clients' streams, and with ``max_count`` only
    for an ensemble's decoupled steps (``max_inflight_requests``, https://github.com/triton-inference-server/server/pull/8458). A sender on the hub
    thread never waits, nor does anyone once the channel is closed or cancelled, or for the final response."""

    __slots__ = ("_max_count", "_max_bytes", "_resume_count", "_resume_bytes", "_sizes", "_bytes_in",
                 "_bytes_out", "_waiters", "_hub_thread", "on_taken", "on_closed", "remote_waiting", "_account",
                 "_stall", "_taken", "_streams", "_remote_seen", "_remote_quiet", "__weakref__")

    def __init__(self, max_count: int, max_bytes: int | None = None, account: StreamAccount | None = None,
                 stall: float | None = None, streams: OpenStreams | None = None) -> None:
        """``account``: the bound this channel shares with the other requests of its stream (instead
        of ``max_count`` / ``max_bytes`` of its own). ``stall``: a producer that waited that many seconds
        while the consumer took nothing ends the request (:meth:`_stalled`); None: it waits as long as
        the consumer lives (a BLS caller, an ensemble's step). ``streams``: the server's open channels,
        which count this one until it closes (None: uncounted)."""
        super().__init__()
        if account is not None:
            max_count, max_bytes = account.max_count, account.max_bytes
            account.channels.add(self)
        self._account = account
        self._max_count = max(1, max_count)
        self._max_bytes = max_bytes
        self._resume_count = self._max_count // 2
        self._resume_bytes = (max_bytes or 0) // 2
        self._sizes: collections.deque[int] = collections.deque()  # of the items, in order (bytes counted)
        self._bytes_in = 0  # bytes sent, ever (written by senders under the lock)
        self._bytes_out = 0  # bytes received, ever (written by the consumer)
        self._waiters: list[LockWaiter | HubWaiter] = []  # producers waiting for room (under the lock)
        self._hub_thread = _get_ident()
        self._stall = stall
        self._taken = 0  # responses the consumer took, ever (progress, for a stalled stream)
        # a producer in another process (isolated.py) is told what was taken and says when it waits
        self.on_taken: Callable[[int, bool], None] | None = None  # (size, final), in the consumer greenlet
        # (responses, bytes) dropped unread by close(), the final not counted: the hub, once
        self.on_closed: Callable[[int, int], None] | None = None
        self.remote_waiting = False  # its send waits for credit (written by the thread that reads it)
        self._remote_seen = self._remote_quiet = 0  # that producer's looks: progress seen, looks without any
        self._streams = streams
        if streams is not None:
            streams.add(self)

    @property
    def held(self) -> tuple[int, int, int]:
        """(responses, bytes, waiting producers) now: what the consumer has not taken yet (a racy snapshot)."""
        return len(self._items), self._bytes_in - self._bytes_out, len(self._waiters) + self.remote_waiting

    @property
    def window(self) -> Window:
        return Window(self._max_count, self._max_bytes)

    @property
    def stall_look(self) -> float | None:
        """How often a waiting producer looks whether its consumer took anything (None: no stall)."""
        return None if self._stall is None else self._stall / _STALL_STEPS

    def remote_wait(self, waiting: bool) -> None:
        """The thread that reads a producer in another process (isolated.py): its send started to wait
        for credit (True), looks again while it waits (True, every :attr:`stall_look` s), or goes on
        (False). The looks count as an in-process producer's timed-out waits do (:meth:`wait_for_room`):
        with nothing taken for ``stall`` s the request is cancelled there as here, or a client that stopped
        reading held an isolated model's instance until the send timeout, as it did an in-process one's."""
        if not waiting:
            self.remote_waiting = False
            return
        progress = self._progress()
        if not self.remote_waiting:
            self.remote_waiting = True
            self._remote_seen, self._remote_quiet = progress, 0
            return
        self._remote_quiet = self._remote_quiet + 1 if progress == self._remote_seen else 0
        self._remote_seen = progress
        if self._stall is not None and self._remote_quiet >= _STALL_STEPS:
            self._stalled()

    @property
    def account(self) -> StreamAccount | None:
        """The bound it shares with the other requests of its stream (None: one of its own)."""
        return self._account

    def send(self, item: Any, final: bool) -> None:
        size = response_bytes(item) if self._max_bytes is not None else 0
        if self._queue(item, final, size) and not final and self._over() and _get_ident() != self._hub_thread:
            self.wait_for_room()

    def put(self, item: Any, final: bool, size: int) -> bool:
        """Any thread: queue one response of ``size`` bytes without waiting, for a producer that keeps
        the bound itself: an isolated model's process, through credits (``runtime/stream_credits.py``).
        Whether it was queued (not once closed: the producer's credit for it must come back another way)."""
        return self._queue(item, final, size)

    def _queue(self, item: Any, final: bool, size: int) -> bool:
        """Whether it was queued (not after the final response, nor once closed)."""
        with self._send_lock:
            if self._final_sent or self._closed:
                return False
            if final:
                self._final_sent = True
            self._bytes_in += size
            self._sizes.append(size)  # before the item: the consumer pops a size for every item it takes
            self._items.append((item, final))
            if self._account is not None:
                self._account.add(1, size)
            self._wake.send()
        return True

    def _over(self) -> bool:
        if self._account is not None:
            return self._account.over()
        max_bytes = self._max_bytes
        return len(self._items) >= self._max_count or (
            max_bytes is not None and self._bytes_in - self._bytes_out > max_bytes)

    def _has_room(self) -> bool:
        if self._account is not None:
            return self._account.has_room()
        return len(self._items) <= self._resume_count and self._bytes_in - self._bytes_out <= self._resume_bytes

    def receive(self, timeout: float | None = None) -> Item:
        item, final, _size = self.receive_sized(timeout)
        return item, final

    def receive_sized(self, timeout: float | None = None) -> tuple[Any, bool, int]:
        item, final = super().receive(timeout)
        size = self._sizes.popleft()
        self._bytes_out += size
        self._taken += 1
        account = self._account
        if account is not None:
            account.taken += 1
            account.add(-1, -size)
            if account.has_room():
                account.wake_all()
        elif self._waiters and self._has_room():
            self._wake_waiters()
        if self.on_taken is not None:
            self.on_taken(size, final)
        return item, final, size

    def wait_for_room(self) -> None:
        """Any thread but the hub greenlet: wait until the channel is down to half its bound, or its
        consumer is gone. Registered first and checked after (the consumer takes first and looks for
        waiters after), so one of the two always sees the other."""
        if self._has_room() or self._closed or self._cancelled:
            return
        waiter = stream_waiter(self._hub_thread)
        if waiter is None:
            return  # the hub itself: it must never block
        with self._send_lock:
            self._waiters.append(waiter)
        if self._has_room() or self._closed or self._cancelled:
            with self._send_lock:
                if waiter in self._waiters:  # not being woken: leave
                    self._waiters.remove(waiter)
                    waiter.discard()
                    return
        # looks every fifth of ``stall``: stalled once that long passed with nothing taken
        step = None if self._stall is None else self._stall / _STALL_STEPS
        seen, quiet = self._progress(), 0
        while not waiter.wait(self._send_lock, self._waiters, step):
            progress = self._progress()
            quiet = quiet + 1 if progress == seen else 0
            seen = progress
            if quiet >= _STALL_STEPS:
                self._stalled()  # wakes every waiter, this one too

    def _progress(self) -> int:
        """Responses the consumer took, ever (of its whole stream when it shares one)."""
        return self._account.taken if self._account is not None else self._taken

    def _stalled(self) -> None:
        """Producer side: the consumer took nothing for ``stall`` s while a producer waited at the bound.
        The request is cancelled as if its client had left (``is_cancelled()``, later sends dropped,
        waiting ones released), and its stream ends with a CANCELLED error after what it holds, for a
        client that reads again; what is queued stays within the bound until the front end closes."""
        error = TritonError(Code.CANCELLED, f"the client took no response for {self._stall:g} s while the "
                                            "model waited for it to read; the request was cancelled")
        if self._queue(error, True, 0):
            self._cancelled = True
            # a producer in another process hears it as a client's cancel (its waiting send returns);
            # on_cancel never waits (it queues a frame), so the reader thread may call it
            on_cancel, self.on_cancel = self.on_cancel, None
            if on_cancel is not None:
                on_cancel()
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Consumer side: every waiting producer goes on (wake-ups under the lock: see the waiters)."""
        with self._send_lock:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.wake()

    def close(self) -> None:
        with self._send_lock:  # as the base class's, and what it held leaves its stream's account at once
            if self._closed:
                return
            self._closed = True
            self._wake.close()
            dropped = len(self._sizes), sum(self._sizes)
            # what an isolated producer's credit was charged for: not the final, which never waits
            final = self._sizes[-1] if self._items and self._items[-1][1] else None
            charged = dropped if final is None else (dropped[0] - 1, dropped[1] - final)
            self._items.clear()
            self._sizes.clear()
        self._release()
        if self._streams is not None:
            self._streams.discard(self)
        on_closed, self.on_closed = self.on_closed, None
        if on_closed is not None:
            on_closed(*charged)
        account = self._account
        if account is not None:
            account.channels.discard(self)
            if dropped[0]:
                account.add(-dropped[0], -dropped[1])
            if account.has_room():
                account.wake_all()

    def _release(self) -> None:
        self._wake_waiters()


class ChannelResponses:
    """What a streaming inference yields: ``(item, final)`` from its channel until the final one.
    :meth:`close` (also before the first item, unlike a generator's) cancels the request when it is
    not finished, which releases a producer waiting for room, and closes the channel."""

    __slots__ = ("_channel", "_closed")

    def __init__(self, channel: ResponseChannel) -> None:
        self._channel = channel
        self._closed = False

    def __iter__(self) -> ChannelResponses:
        return self

    def __next__(self) -> Item:
        item, final, _size = self.next_sized()
        return item, final

    def next_sized(self) -> tuple[Any, bool, int]:
        """The next ``(item, final, size)``: the size the channel measured when the item was sent (a
        consumer that keeps its own account, the BLS pump, does not measure a response again)."""
        if self._closed:
            raise StopIteration
        item, final, size = self._channel.receive_sized()
        if final:
            self.close()
        return item, final, size

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            channel = self._channel
            if not channel.finished:
                channel.cancelled = True  # the consumer went away: the model sees is_cancelled()
            channel.close()

    __del__ = close  # dropped unclosed (as a generator is closed when collected)

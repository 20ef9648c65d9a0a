"""Flow-control credits of a decoupled request whose responses cross a pipe (sans-I/O: numbers in, numbers out).

An isolated Python model (``backends/python/isolated.py``) sends every request's responses to the server
over one pipe, read by one thread. If that thread waited for a slow client's stream to have room, every
other request of the process would wait with it; so the server never waits there, and the bound of a
client's stream (``runtime/response_channel.py``: 1024 responses or 4 MiB not yet taken) is kept in the
model's process instead, per request, as HTTP/2 keeps a window per stream (RFC 9113 §5.2):

* :class:`SendCredit` (the model's process): what one request sent that the client has not taken yet.
  ``response_sender.send()`` waits while it holds the window (:meth:`SendCredit.may_send`), on the
  model's own thread; the final response never waits.
* :class:`CreditReturn` (the server, the hub greenlet that takes the request's responses from its
  channel): what the client took and the process was not told yet; it says when to tell it
  (``("credit", key, responses, bytes)``): once half the window's responses or bytes were taken, so a
  stream costs one frame per half window, and a process that waits always hears (see :meth:`taken`).

Both sides count a response's bytes as the model's process measured them (``inference.response_bytes``),
sent with the response: the server grants back exactly what was spent, so the window never drifts.

The requests of one gRPC stream share one bound (``StreamAccount``), so in the model's process they share
one :class:`SendCredit` too, keyed by the account's id sent with each ``execute`` (:class:`SharedCredits`),
and the server returns credit per account (``("stream_credit", account, responses, bytes)``) from one
:class:`CreditReturn` as its client takes a response of any of them. A shared window outlives its
requests, so every response it was charged must come back: the final response is never charged (it
never waits), and what the server drops unread (the request's channel closed with responses in it, or
one that arrived after) is granted back at once (:meth:`CreditReturn.release`). Before, each request of
an isolated model had the whole stream's window to itself: 8 requests on a stream that reads nothing
held 512 responses (32 MiB); now 64, as in-process (64, and one per request under way).

A decoupled BLS stream that such a model reads runs the other way round (``backends/python/bls_relay.py``):
the model's process takes, so it keeps the :class:`CreditReturn` (``("call_taken", id, responses,
bytes)``, the sizes the server sent with each response), and the server's side sends, bounded by the
BLS pump (``server_calls._wait_for_room``) that the grants feed.
Owner: each object belongs to one request (or one stream's account) on one side; callers hold their own
lock where several threads touch it (the model's process: the request's condition, or for the accounts
``ModelProcess.shared_room``). Failure: none; a grant larger than what is held
(a bug of ours) leaves the credit at zero held, never negative.
"""

from __future__ import annotations

from typing import NamedTuple


class Window(NamedTuple):
    """The most one request may hold not yet taken: ``responses``, and ``bytes`` of outputs (None: no byte
    bound). A response that goes over ``bytes`` is let through alone, as the server's channel does."""

    responses: int
    bytes: int | None


class SendCredit:
    """The model's process, one per request: what it sent that the server says is not taken yet."""

    __slots__ = ("window", "responses", "bytes", "users")

    def __init__(self, window: Window | None) -> None:
        self.window = window  # None: the consumer has no bound (a warmup): never wait
        self.responses = 0
        self.bytes = 0
        self.users = 0  # requests using it not yet finished (a stream's shared credit: see SharedCredits)

    def may_send(self) -> bool:
        """Whether a response may go now: fewer than ``window.responses`` held and at most ``window.bytes``."""
        window = self.window
        if window is None:
            return True
        return self.responses < window.responses and (window.bytes is None or self.bytes <= window.bytes)

    def spend(self, size: int) -> None:
        """One response of ``size`` bytes went to the server."""
        self.responses += 1
        self.bytes += size

    def refund(self, responses: int, size: int) -> None:
        """The server granted back ``responses`` taken, ``size`` bytes in all."""
        self.responses = max(0, self.responses - responses)
        self.bytes = max(0, self.bytes - size)

    @property
    def idle(self) -> bool:
        """No request uses it and the server holds nothing it was charged: a shared one may be forgotten
        (a later request of its stream starts from an empty window, which is then exact)."""
        return self.users == 0 and self.responses == 0 and self.bytes == 0


class SharedCredits:
    """The model's process: the credit of each stream's account, shared by its requests; a request
    without an account (HTTP ``generate_stream``, BLS, an ensemble's step) gets one of its own. Callers
    hold one lock around every method and the credits' counts (the process's; its reader thread grants,
    the model's threads open, spend and end)."""

    __slots__ = ("_by_account",)

    def __init__(self) -> None:
        self._by_account: dict[int, SendCredit] = {}

    def open(self, window: Window | None, account: int | None) -> SendCredit:
        """A request starts: its account's credit (made for the first), or a credit of its own."""
        credit = self._by_account.get(account) if account is not None else None
        if credit is None:
            credit = SendCredit(window)
            if account is not None:
                self._by_account[account] = credit
        credit.users += 1
        return credit

    def end(self, account: int | None) -> None:
        """A request of ``account`` finished (its final response went, or ``execute`` failed)."""
        credit = self._by_account.get(account) if account is not None else None
        if credit is not None:
            credit.users -= 1
            self._forget_if_idle(account, credit)

    def grant(self, account: int, responses: int, size: int) -> SendCredit | None:
        """The server granted back to ``account``; its credit (None: forgotten, nothing waits on it)."""
        credit = self._by_account.get(account)
        if credit is not None:
            credit.refund(responses, size)
            self._forget_if_idle(account, credit)
        return credit

    def __len__(self) -> int:
        return len(self._by_account)

    def _forget_if_idle(self, account: int | None, credit: SendCredit) -> None:
        if credit.idle:
            self._by_account.pop(account, None)


class CreditReturn:
    """The taker, one per stream: responses taken and not yet granted back (the server for a client's
    stream; the model's process for a BLS stream it reads)."""

    __slots__ = ("_every", "_every_bytes", "responses", "bytes")

    def __init__(self, window: Window) -> None:
        self._every = max(1, window.responses // 2)
        self._every_bytes = None if window.bytes is None else max(1, window.bytes // 2)
        self.responses = 0
        self.bytes = 0

    def taken(self, size: int) -> tuple[int, int] | None:
        """One response of ``size`` bytes (as the process counted it) was taken; ``(responses, bytes)`` to
        grant now, or None. Granting at half the window in either unit keeps a waiting process live: it
        waits only while it holds a whole window (responses or bytes), so once the client took all of
        it the untold half has been reached and told."""
        self.responses += 1
        self.bytes += size
        if self.responses < self._every and (self._every_bytes is None or self.bytes < self._every_bytes):
            return None
        grant = (self.responses, self.bytes)
        self.responses = self.bytes = 0
        return grant

    def release(self, responses: int, size: int) -> tuple[int, int] | None:
        """A request's channel closed, dropping ``responses`` (``size`` bytes) its client never took (none,
        for one that ended normally): those, and whatever was taken and not yet granted, to grant now
        (None: nothing). A shared window gets back all it was charged by the time its requests ended."""
        self.responses += responses
        self.bytes += size
        if not self.responses and not self.bytes:
            return None
        grant = (self.responses, self.bytes)
        self.responses = self.bytes = 0
        return grant

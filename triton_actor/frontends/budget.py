"""One process-wide budget for the bytes of requests being received and served (issue 14 §3).

Each connection is bounded on its own (HTTP/1: one request at a time, ``--http-max-input-size``;
HTTP/2: streams per connection, unconsumed bytes), but a thousand connections each inside its bounds
still add up to more memory than the host has. Both front ends therefore draw on one budget: an HTTP
request reserves its Content-Length before the body is read (it waits, first come first served, while
the budget is spent: TCP holds the client back, as nginx's buffers do); a chunked body and a gRPC
message reserve their bytes as they arrive (:func:`with_room`), and are refused (503,
RESOURCE_EXHAUSTED) when they do not fit: a request that holds part of the budget never waits for more,
so partial reservations cannot deadlock, and a stream cannot wait without stalling its connection's
other streams. Those may take what fits past the HTTP bodies waiting in line, which then wait at most
their body timeout. A reservation lasts until the request is answered; a body that arrives under
``--request-body-min-rate`` loses it (408 / DEADLINE_EXCEEDED: the protocol state machines keep that
deadline), so a slow client cannot hold it for ever.

A request larger than the whole budget is let in when nothing else holds any: it runs alone, so the
bytes held stay under ``max(limit, the largest single request)``. ``limit`` 0 turns the budget off.
Owned by the hub thread (the front ends' greenlets); no locks.
"""

from __future__ import annotations

from collections import deque

import gevent
import gevent.event

FIRST_INSTALLMENT = 16 * 1024  # what a chunked body waits in line for before its first read
_MOST_AHEAD = 256 * 1024


def with_room(received: int) -> int:
    """What a body reserved as it arrives should hold for ``received`` bytes: them, and as many again
    ahead, at most 256 KiB (so a 64 MiB body makes a few hundred reservations, not one per read, and
    a client that announces much and sends little holds about what it sent)."""
    return received + min(received, _MOST_AHEAD)


class ByteBudget:
    """``reserve`` / ``try_reserve`` bytes, ``release`` them when the request is over."""

    __slots__ = ("limit", "used", "_waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, gevent.event.Event]] = deque()

    def _fits(self, n: int) -> bool:
        return not self.limit or self.used + n <= self.limit or not self.used

    def try_reserve(self, n: int, barge: bool = False) -> bool:
        """Reserve ``n`` bytes now if they fit and nobody waits in line (``barge``: even if someone
        does — a caller that cannot wait takes what fits now); False otherwise."""
        if (self._waiters and not barge) or not self._fits(n):
            return False
        self.used += n
        return True

    def reserve(self, n: int, timeout: float | None) -> bool:
        """Reserve ``n`` bytes, waiting in line at most ``timeout`` seconds; False when the wait ran out."""
        if self.try_reserve(n):
            return True
        entry = (n, gevent.event.Event())
        self._waiters.append(entry)
        try:
            if entry[1].wait(timeout):
                return True  # granted: _grant counted it
        except BaseException:
            if entry[1].is_set():  # granted just as we were killed: give it back
                self.release(n)
            raise
        finally:
            if not entry[1].is_set():
                self._waiters.remove(entry)
                self._grant()  # we may have been the head of the line that others waited behind
        return False

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._grant()

    def _grant(self) -> None:
        waiters = self._waiters
        while waiters and self._fits(waiters[0][0]):
            n, event = waiters.popleft()
            self.used += n
            event.set()

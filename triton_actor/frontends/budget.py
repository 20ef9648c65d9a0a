"""One process-wide budget for the bytes of requests being received and served (issue 14 §3).

Each connection is bounded on its own (HTTP/1: one request at a time, ``--http-max-input-size``;
HTTP/2: streams per connection, unconsumed bytes), but a thousand connections each inside its bounds
still add up to more memory than the host has. Both front ends therefore draw on one budget: an HTTP
request reserves its body before it is read (it waits, first come first served, while the budget is
spent: TCP holds the client back, as nginx's buffers do), a gRPC message reserves its bytes as they
arrive (a stream cannot wait without stalling its connection's other streams, so it is refused with
RESOURCE_EXHAUSTED instead; it may take what fits past the HTTP bodies waiting in line, which then wait
at most their body timeout). A reservation lasts until the request is answered.

A request larger than the whole budget is let in when nothing else holds any: it runs alone, so the
bytes held stay under ``max(limit, the largest single request)``. ``limit`` 0 turns the budget off.
Owned by the hub thread (the front ends' greenlets); no locks.
"""

from __future__ import annotations

from collections import deque

import gevent
import gevent.event


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

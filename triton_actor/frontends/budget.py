"""One process-wide budget for the bytes of requests being received and served (docs/security.md#memory-and-hub-time-per-request).

Each connection is bounded on its own (HTTP/1: one request at a time, ``--http-max-input-size``;
HTTP/2: streams per connection, unconsumed bytes), but a thousand connections each inside its bounds
still add up to more memory than the host has. Both front ends therefore draw on one budget: an HTTP
request reserves its Content-Length before the body is read (it waits in line, earliest body deadline
first, while the budget is spent: TCP holds the client back, as nginx's buffers do); a chunked body and a gRPC
message reserve their bytes as they arrive (:func:`with_room`), and are refused (503,
RESOURCE_EXHAUSTED) when they do not fit: a request that holds part of the budget never waits for more,
so partial reservations cannot deadlock, and a stream cannot wait without stalling its connection's
other streams. Those may take what fits past the HTTP bodies waiting in line, which then wait at most
their body timeout. A reservation lasts until the request is answered; a body that arrives under
``--request-body-min-rate`` loses it (408 / DEADLINE_EXCEEDED: the protocol state machines keep that
deadline), so a slow client cannot hold it for ever, and while others wait for the budget (``pressed``)
an HTTP body's grace before that rate applies is one second, not ``--request-body-grace-secs``.

The last sixteenth of the budget is a lane for small requests (at most 1/1024 of it, 1 MiB by default):
big bodies held or waiting never make an ordinary inference request wait (:class:`ByteBudget`).
A request larger than the whole budget is let in when nothing else holds any: it runs alone, so the
bytes held stay under ``max(limit, the largest single request)``. ``limit`` 0 turns the budget off.
Owned by the hub thread (the front ends' greenlets); no locks.
"""

from __future__ import annotations

import heapq
from time import monotonic

import gevent
import gevent.event

FIRST_INSTALLMENT = 16 * 1024  # what a chunked body waits in line for before its first read
SMALL_REQUEST = 64 * 1024  # a request at most this big (or 1/1024 of the budget) may use the small lane
_MOST_AHEAD = 256 * 1024


_Waiter = tuple[float, int, int, gevent.event.Event]  # (place in line, arrival, bytes, granted)


def with_room(received: int) -> int:
    """What a body reserved as it arrives should hold for ``received`` bytes: them, and as many again
    ahead, at most 256 KiB (so a 64 MiB body makes a few hundred reservations, not one per read, and
    a client that announces much and sends little holds about what it sent)."""
    return received + min(received, _MOST_AHEAD)


class ByteBudget:
    """``reserve`` / ``try_reserve`` bytes, ``release`` them when the request is over.

    Two lines: the small requests' (at most 1/1024 of the budget, at least :data:`SMALL_REQUEST`) may
    use all of it, the big requests' all but its last sixteenth (the small lane, ``_fits``), so big
    bodies held or waiting, however many, never keep an ordinary inference request waiting. Each line is
    served earliest deadline first: a waiter's place is when it came plus the time its body may take at
    ``rate`` (``--request-body-min-rate``; 0: first come first served), so a smaller request goes ahead
    of bigger ones that came before it (a 64 MiB body counts as coming 64 s later at 1 MiB/s) and
    clients that declare big bodies and send nothing (http1 ``press``) cannot keep a line of them ahead
    of everyone, while a big request still goes before anything that came after its deadline (none waits
    for ever). The head of a line takes the next bytes freed: nothing in its line passes it that does
    not come before it."""

    __slots__ = ("limit", "used", "rate", "_small", "_lane", "_lines", "_seq", "line_formed", "_refused_at")

    def __init__(self, limit: int, rate: float = 0.0) -> None:
        self.limit = limit
        self.used = 0
        self.rate = rate
        self._small = max(SMALL_REQUEST, limit >> 10)  # 1 MiB of the default 1 GiB
        self._lane = limit >> 4  # 64 MiB of it
        # heaps of (place, seq, n, granted): the small requests' line, the big requests' line
        self._lines: tuple[list[_Waiter], list[_Waiter]] = ([], [])
        self._seq = 0
        # set when a request starts waiting in line or is refused for want of room: the HTTP reaper then
        # presses the bodies that hold the budget (http1.ServerConnection.press), and clears it
        self.line_formed = gevent.event.Event()
        self._refused_at = -1e9

    @property
    def pressed(self) -> bool:
        """Someone waits in line for bytes held by others, or was refused them within the last second
        (a gRPC message or a chunked body does not wait: it is refused)."""
        small, big = self._lines
        return bool(small or big) or monotonic() - self._refused_at < 1.0

    def refusal(self) -> str:
        """What a request refused for want of room is told (503 on HTTP, RESOURCE_EXHAUSTED on gRPC)."""
        return f"the server is busy: {self.used} bytes of requests are held (request memory budget {self.limit}); " \
               "retry later"

    def _place(self, n: int) -> float:
        return monotonic() + n / self.rate if self.rate else monotonic()

    def _fits(self, n: int) -> bool:
        """Within the limit, a big request within all but the small lane; any request when nothing is
        held (one larger than the whole budget runs alone)."""
        limit = self.limit
        return not limit or self.used + n <= (limit if n <= self._small else limit - self._lane) or not self.used

    def try_reserve(self, n: int, barge: bool = False) -> bool:
        """Reserve ``n`` bytes now if they fit and nobody waiting in its line comes before it (``barge``:
        even if someone does — a caller that cannot wait takes what fits now); False otherwise."""
        small, big = self._lines
        if (small or big) and not barge:
            line = big if n > self._small else small
            if line and self._place(n) >= line[0][0]:
                return False
        elif n <= self._small and self.used + n <= self.limit:  # _fits' common case, without its call
            self.used += n
            return True
        if not self._fits(n):
            self._refused_at = monotonic()
            self.line_formed.set()
            return False
        self.used += n
        return True

    def reserve(self, n: int, timeout: float | None) -> bool:
        """Reserve ``n`` bytes, waiting in line at most ``timeout`` seconds; False when the wait ran out."""
        if self.try_reserve(n):
            return True
        self._seq += 1
        entry = (self._place(n), self._seq, n, gevent.event.Event())
        line = self._lines[n > self._small]
        heapq.heappush(line, entry)
        self.line_formed.set()
        granted = entry[3]
        try:
            if granted.wait(timeout):
                return True  # granted: _grant counted it
        except BaseException:
            if granted.is_set():  # granted just as we were killed: give it back
                self.release(n)
            raise
        finally:
            if not granted.is_set():
                line.remove(entry)
                heapq.heapify(line)
                self._grant()  # we may have been the head of the line that others waited behind
        return False

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            small, big = self._lines
            if small or big:  # (nobody waits: nothing to grant, and no call)
                self._grant()

    def _grant(self) -> None:
        for line in self._lines:
            while line and self._fits(line[0][2]):
                _, _, n, granted = heapq.heappop(line)
                self.used += n
                granted.set()

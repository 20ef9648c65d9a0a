"""Descriptors for client connections: one count for every port of the process, and an accept that
pauses, quietly, at the descriptor limit (docs/security.md#descriptors).

Each port has its own connection cap, but the HTTP, gRPC and metrics ports draw on the same
descriptor table: three caps that each leave headroom still add up to more than the process may
open, and then ``accept`` fails with EMFILE for every client (gevent logs a traceback each time).
:class:`ConnectionSlots` is the one count: a connection takes a slot when it is accepted and gives
it back when its socket is closed, and the slots stop short of the soft ``RLIMIT_NOFILE`` by a quarter
(at least 64), left to model files, threads' pipes and the listeners; half of that quarter may go to
client shared-memory regions (:func:`region_total`, each holds a descriptor). When they run out, the
connections that wait longest for a request (HTTP keep-alive between requests, HTTP/2 with no stream
open) are closed first, whatever their port, as nginx drains its "reusable" connections from one
queue per worker; if none waits, the new connection is closed.

:class:`Listener` is gevent's ``StreamServer`` whose accept, failing for want of descriptors or memory
(EMFILE, ENFILE, ENOBUFS, ENOMEM: something beside the connections used the headroom), pauses accepting
(10 ms, doubling to 1 s; nginx pauses 500 ms) and logs one warning a minute instead of a traceback per
try. Both are owned by the hub thread; no locks.
"""

from __future__ import annotations

import errno
import heapq
import logging
import resource
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from gevent.server import StreamServer

log = logging.getLogger(__name__)

_HEADROOM_MIN = 64
_DRAIN_BATCH = 32  # nginx drains up to 32 reusable connections at a time when it runs out
_BARREN_S = 0.1
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

# (waiting since, close it): a connection that may be closed to make room, as a port lists them
Reusable = tuple[float, Callable[[], None]]


def _headroom(soft: int) -> int:
    return max(_HEADROOM_MIN, soft // 4)


def descriptor_total() -> int:
    """Client connections this process may hold on all its ports: the soft open-file limit less a
    quarter of it (at least 64) for everything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(1, soft - _headroom(soft))


def region_total() -> int:
    """System shared-memory regions this process may hold (each keeps its object's descriptor open):
    half of the headroom :func:`descriptor_total` leaves beside the connections. The other half is
    what the server needs besides: 8 descriptors with the example models loaded and served, 12 more
    per process-isolated Python instance (its pipes), a few while a model loads; so at the common
    soft limit of 1024, 768 connections, 128 regions and 128 for the rest (about 9 isolated instances)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(1, _headroom(soft) // 2)


def close_longest_waiting(reusable: list[Reusable]) -> int:
    """Close the :data:`_DRAIN_BATCH` connections of ``reusable`` that have waited longest (nginx's
    reusable-connection drain); returns how many were closed."""
    for _since, close in heapq.nsmallest(_DRAIN_BATCH, reusable, key=lambda r: r[0]):
        close()
    return min(len(reusable), _DRAIN_BATCH)


def descriptor_cap(wanted: int) -> int:
    """``wanted`` connections for one port, lowered to what the process may hold on all of them."""
    return max(1, min(wanted, descriptor_total()))


class ConnectionSlots:
    """``take`` a slot per accepted connection, ``give`` it back once its socket is closed; ports
    ``register`` the lister of their reusable connections, drained when the slots run out."""

    __slots__ = ("total", "used", "_listers", "_warned_at", "_barren_until")

    def __init__(self, total: int | None = None) -> None:
        self.total = descriptor_total() if total is None else total
        self.used = 0
        self._listers: list[Callable[[], Iterable[Reusable]]] = []
        self._warned_at = -1e9
        self._barren_until = -1e9  # a drain that found nothing to close is not tried again before this

    def register(self, lister: Callable[[], Iterable[Reusable]]) -> None:
        self._listers.append(lister)

    def unregister(self, lister: Callable[[], Iterable[Reusable]]) -> None:
        if lister in self._listers:
            self._listers.remove(lister)

    def take(self, port: str) -> bool:
        """A slot for a connection just accepted on ``port`` (named in the warning); False when none
        is free and no connection waits to be reused: the caller closes the new one."""
        if self.used >= self.total:
            self._drain(port)
        if self.used >= self.total:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1

    def _drain(self, port: str) -> None:
        """Close the connections waiting longest, on any port; their closers give their slots back.
        Listing them walks every connection: after a drain that found none, a flood of new connections
        is refused for :data:`_BARREN_S` without walking them again."""
        now = time.monotonic()
        if now < self._barren_until:
            return
        reusable = [r for lister in self._listers for r in lister()]
        closed = close_longest_waiting(reusable)
        if not reusable:
            self._barren_until = now + _BARREN_S
        if now - self._warned_at > 60:
            self._warned_at = now
            log.warning("%d client connections open on all ports (the most this process's open-file limit "
                        "allows, less headroom): closed %d waiting for a request%s", self.total,
                        closed, "" if reusable else f", and a new one on the {port} port")


class Listener(StreamServer):
    """gevent's StreamServer whose accept pauses quietly when descriptors run out (module doc).

    One accept per readiness event, as nginx without ``multi_accept``: a connection is counted (and
    the caps applied) by its greenlet, so gevent's 100 accepts per event could open 100 descriptors
    before any is counted, more than the headroom of a small limit."""

    max_accept = 1
    _PAUSE_MIN, _PAUSE_MAX = 0.01, 1.0
    _pause_s = _PAUSE_MIN
    _warned_at = -1e9

    def do_read(self) -> Any:
        try:
            accepted = super().do_read()
        except OSError as e:
            if e.errno not in _OUT_OF_DESCRIPTORS:
                raise
            self._pause(e)
            return None
        if accepted:
            self._pause_s = self._PAUSE_MIN
        return accepted

    def _pause(self, error: OSError) -> None:
        now = time.monotonic()
        if now - self._warned_at > 60:
            self._warned_at = now
            log.warning("accept on %s:%s failed (%s): pausing new connections for %.2f s", *self.address[:2],
                        error.strerror or error, self._pause_s)
        self.stop_accepting()
        timer = self.loop.timer(self._pause_s)
        timer.start(self._resume, timer)
        self._pause_s = min(self._PAUSE_MAX, self._pause_s * 2)

    def _resume(self, timer: Any) -> None:
        timer.close()
        if self.started and not self.closed:
            self.start_accepting()


def bind(address: str, port: int, reuse_port: bool, name: str) -> socket.socket:
    """A listening TCP socket on ``(address, port)``; ``reuse_port``: SO_REUSEPORT, so other processes that
    set it too may bind the same port (Triton's --reuse-http-port / --reuse-grpc-port; the kernel spreads
    connections among them). Raises OSError naming the port."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise OSError(f"failed to bind {name} to {address}:{port}: {e.strerror or e}") from None
    return sock

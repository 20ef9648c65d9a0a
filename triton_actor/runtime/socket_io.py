"""Two socket calls on the hot path, cheaper than gevent's generic ones for how we use them (the front
ends' drivers call them; they live here because gevent's internals are the runtime's alone).

gevent's ``recv`` tries the read first and, on EAGAIN, waits and tries again; a connection between
requests has nothing to read yet, so that first try only costs a raised exception: here it waits, then
reads with one direct call. gevent's
``sendall`` runs a Python loop over chunks; a response usually goes to the kernel in one ``send``.
Both fall back to gevent's own calls, so timeouts, partial sends and closed sockets behave as
before. They use gevent's socket internals (``_sock``, ``_wait``, ``_read_event``, as gevent's own
socket subclasses do; gevent is pinned below the next major version for them) and
``tests/unit/runtime/test_socket_io.py`` checks them against a real socket pair. With fast paths off
(:mod:`triton_actor.runtime.fastpath`) both are gevent's public calls.
"""

from __future__ import annotations

import socket
from typing import Any

from . import fastpath


def send_all(sock: Any, data: bytes) -> None:
    """``sock.sendall(data)``: one direct ``send`` when the kernel takes it all."""
    if not fastpath.enabled:
        sock.sendall(data)
        return
    try:
        sent = sock._sock.send(data)
    except BlockingIOError:
        sent = 0
    if sent != len(data):
        sock.sendall(memoryview(data)[sent:])


def send_now(sock: Any, data: bytes) -> int:
    """What the kernel takes of ``data`` at once without waiting (a direct ``send``; 0 with fast paths
    off, the caller then sends it all its own way)."""
    if not fastpath.enabled:
        return 0
    try:
        return sock._sock.send(data)
    except BlockingIOError:
        return 0


def recv_when_readable(sock: Any, size: int) -> bytes:
    """``sock.recv(size)`` for a socket expected to have nothing yet: wait first, then read (directly:
    gevent's ``recv`` is a Python frame around the same call, ~30 bytecodes a request)."""
    if fastpath.enabled:
        sock._wait(sock._read_event)
        try:
            return sock._sock.recv(size)
        except BlockingIOError:  # woken with nothing to read after all: gevent's recv waits again
            pass
    return sock.recv(size)


class Woken(Exception):
    """Thrown into a greenlet waiting to read a socket by :func:`wake_reader`."""


def wake_reader(sock: Any) -> None:
    """Wake the greenlet waiting to read ``sock`` with :class:`Woken` (nothing when none waits): what
    gevent's own ``close`` does with EBADF, leaving the socket open. ``shutdown(SHUT_RD)`` would wake it
    too, but Linux answers data that arrives after our FIN on a socket whose read side is shut with a
    reset (TCPAbortOnData), which throws away the answer the woken reader sends before lingering."""
    sock.hub.cancel_wait(sock._read_event, Woken())


class PeerWatch:
    """Tells that a client closed its connection while its request waits for an answer, with an io
    watcher on the connection's socket and no greenlet (made at the first such request, reused by the next).
    A greenlet per waiting request (gevent's ``wait_read`` in it, killed at the answer) cost its start,
    a map and an unmap of its Python frame stack, and a GreenletExit thrown into it: a request answered by a
    model's thread, or by a BLS caller's greenlet, paid that each time (``strace -c``: one mmap and one munmap
    a request). Data that arrives instead (a pipelined request) ends the watch, as gevent's did."""

    __slots__ = ("_sock", "_watcher", "_gone")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._watcher: Any = None
        self._gone: Any = None  # the event to set (a gevent Event), while watching

    def start(self, gone: Any) -> None:
        """Hub thread: set ``gone`` once the client has closed its side (or the socket fails)."""
        watcher = self._watcher
        if watcher is None:
            watcher = self._watcher = self._sock.hub.loop.io(self._sock.fileno(), 1)
        self._gone = gone
        watcher.start(self._readable)

    def _readable(self) -> None:
        """The hub's loop: something to read, or the end of the stream."""
        try:
            more = self._sock._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:  # woken with nothing after all: keep watching
            return
        except OSError:
            more = b""
        gone = self._gone
        self.stop()
        if not more and gone is not None:
            gone.set()

    def stop(self) -> None:
        self._gone = None
        if self._watcher is not None:
            self._watcher.stop()

    def close(self) -> None:
        """The connection ends: the watcher goes (before its socket is closed)."""
        watcher, self._watcher, self._gone = self._watcher, None, None
        if watcher is not None:
            watcher.close()


def plain_send_all(sock: Any, data: bytes) -> None:
    """gevent's ``sendall``: for a TLS socket, whose ``_sock`` would bypass the encryption."""
    sock.sendall(data)


def plain_recv(sock: Any, size: int) -> bytes:
    """gevent's ``recv``: for a TLS socket, which may hold decrypted bytes while the raw one is quiet."""
    return sock.recv(size)

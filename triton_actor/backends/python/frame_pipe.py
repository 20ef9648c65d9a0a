"""Frames over the pipes between the server and an isolated model's process: one reader or writer per pipe.

Used on both sides (``isolated_child.py`` in the model's process, ``child_process.py`` and
``isolated.py`` in the server), on native threads only: blocking ``os.read`` / ``os.writev`` on plain
pipe descriptors, no gevent. Owner: a :class:`FrameReader` belongs to the one thread that reads its
pipe; a :class:`FrameWriter` to the one thread that writes it, unless it was given a lock, which keeps
frames whole when several threads send (the model's process does; the server gives each pipe one writer:
the instance's thread for commands, a ``runtime.threads.SerialWriter`` for the rest). Failure: ``send`` to a
peer that is gone raises ``BrokenPipeError`` (Python ignores SIGPIPE; a closed writer raises it too);
a reader returns None at end of file.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
from typing import Any

from .isolation_frames import FrameDecoder, encode

READ_CHUNK = 1 << 18
_IOV_MAX = 512  # below every platform's IOV_MAX


class FrameReader:
    """Messages from one pipe, for the one thread that reads it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._decoder = FrameDecoder()
        self._ready: collections.deque[Any] = collections.deque()

    def read_available(self) -> list[Any] | None:
        """Block for the next bytes; the messages they complete (maybe none), None at end of file."""
        data = os.read(self.fd, READ_CHUNK)
        if not data:
            return None
        return self._decoder.feed(data)

    def next_message(self, timeout: float | None = None) -> Any:
        """The next message (blocking); None at end of file. Raises ``TimeoutError`` after ``timeout`` s."""
        while not self._ready:
            if timeout is not None and not _readable(self.fd, timeout):
                raise TimeoutError(f"no message within {timeout} s")
            messages = self.read_available()
            if messages is None:
                return None
            self._ready.extend(messages)
        return self._ready.popleft()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FrameWriter:
    """Frames into one pipe, from its one writer thread, or from any thread with a ``lock`` (a native
    one: it is held while the pipe is full); ``sent`` counts the frames written so far."""

    def __init__(self, fd: int, lock: Any = None) -> None:
        self.fd = fd
        self.sent = 0
        self._lock = contextlib.nullcontext() if lock is None else lock
        self._closed = False

    def send(self, message: Any) -> None:
        """Write one whole frame (blocks while the pipe is full)."""
        parts = encode(message)
        with self._lock:
            if self._closed:
                raise BrokenPipeError("the pipe is closed")
            _write_all(self.fd, parts)
            self.sent += 1

    def close(self) -> None:
        """The reader at the other end sees end of file (once every writer closed)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()  # not select.select: a busy server's descriptors go past 1024
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while written:
            first = views[0]
            if written >= first.nbytes:
                written -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[written:]
                written = 0

"""The two pipes between the server and an isolated model's process, carrying frames both ways.

Used on both sides (``isolated_child.py`` in the model's process, ``child_process.py`` in the
server), on native threads only: blocking ``os.read`` / ``os.writev`` on plain pipe descriptors,
no gevent. Owner: one reader thread calls :meth:`FramePipe.read_available`; any thread may
:meth:`FramePipe.send` (a lock keeps frames whole). Failure: ``send`` to a peer that is gone raises
``BrokenPipeError`` (Python ignores SIGPIPE); ``read_available`` returns None at end of file.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...protocol.isolation_frames import FrameDecoder, encode

READ_CHUNK = 1 << 18
_IOV_MAX = 512  # below every platform's IOV_MAX


class FramePipe:
    """Frames out on ``write_fd``, frames in from ``read_fd``; :meth:`close` closes both."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._decoder = FrameDecoder()
        self._lock = threading.Lock()  # native here and in the server (bootstrap leaves threading unpatched)
        self._closed = False

    def send(self, message: Any) -> None:
        """Any thread: write one whole frame (blocks while the pipe is full)."""
        parts = encode(message)
        with self._lock:
            if self._closed:
                raise BrokenPipeError("the pipe is closed")
            _write_all(self.write_fd, parts)

    def read_available(self) -> list[Any] | None:
        """Reader thread: block for the next bytes; the messages they complete (maybe none), None at EOF."""
        data = os.read(self.read_fd, READ_CHUNK)
        if not data:
            return None
        return self._decoder.feed(data)

    def close_writer(self) -> None:
        """Close the sending side: the peer reads end of file."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.write_fd)

    def close_reader(self) -> None:
        """Reader thread, when it is done: close the receiving side."""
        os.close(self.read_fd)


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

"""Each worker's control socket: a Unix stream server that runs host handlers for the other workers.

One connection per call (the caller connects, sends one frame, reads one answer): calls are rare
(statistics reads, model control), and a slow call never holds up another.

Thread: everything runs in greenlets on the worker's hub. Failure: a handler's ``TritonError`` goes back as
``[code, message]``; any other exception as INTERNAL; a peer that cannot be reached raises UNAVAILABLE in
the caller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import gevent
from gevent.server import StreamServer

from ..errors import Code, TritonError
from ..protocol import control

log = logging.getLogger("triton_actor.workers")

Dispatch = Callable[[str, dict[str, Any]], Any]
# a Unix socket's path must fit sockaddr_un's sun_path: 108 bytes on Linux, with its terminating NUL
# (104 on the BSDs); a run directory under a long TMPDIR went past it and every worker failed to start
# ("AF_UNIX path too long", seen under pytest's tmp_path once its numbered folders reached three digits)
SUN_PATH_MAX = 107


@contextlib.contextmanager
def reachable(path: str) -> Iterator[str]:
    """A name ``bind``/``connect`` accept for the socket at ``path``: the path itself when it fits, else the
    same file reached through an open descriptor of its folder (``/proc/self/fd/N/NAME``: Linux resolves
    it, and the folder's permissions still apply), valid while the block runs."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX or not os.path.isdir("/proc/self/fd"):
        yield path
        return
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def _read_one(sock: socket.socket, reader: control.FrameReader) -> dict[str, Any] | None:
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        messages = reader.feed(data)
        if messages:
            return messages[0]


class ControlServer:
    """Serves ``dispatch(kind, args)`` on the Unix socket ``path``."""

    def __init__(self, path: str, dispatch: Dispatch) -> None:
        self.path = path
        self.dispatch = dispatch
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        with reachable(path) as name:
            listener.bind(name)
        os.chmod(path, 0o600)
        listener.listen(64)
        self._server = StreamServer(listener, self._handle)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(timeout=1)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _handle(self, sock: socket.socket, _address: Any) -> None:
        try:
            call = _read_one(sock, control.FrameReader())
            if call is None:
                return
            try:
                answer = {"id": call.get("id"), "ok": self.dispatch(str(call["kind"]), call.get("args") or {})}
            except TritonError as e:
                answer = {"id": call.get("id"), "error": [int(e.code), e.message]}
            except Exception as e:
                log.exception("control call %r failed", call.get("kind"))
                answer = {"id": call.get("id"), "error": [int(Code.INTERNAL), f"{type(e).__name__}: {e}"]}
            sock.sendall(control.encode(answer))
        except (OSError, control.ProtocolError) as e:
            log.warning("control connection dropped: %s", e)
        finally:
            sock.close()


def call(path: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
    """Run ``kind`` on the worker listening at ``path`` and return its answer (this greenlet waits)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with gevent.Timeout(timeout, TritonError.unavailable(f"a worker did not answer {kind!r} "
                                                             f"within {timeout:.0f} s")):
            with reachable(path) as name:
                sock.connect(name)
            sock.sendall(control.encode({"id": 1, "kind": kind, "args": args}))
            answer = _read_one(sock, control.FrameReader())
    except OSError as e:
        raise TritonError.unavailable(f"a worker cannot be reached: {e.strerror or e}") from e
    finally:
        sock.close()
    if answer is None:
        raise TritonError.unavailable(f"a worker closed the control connection during {kind!r}")
    if "error" in answer:
        code, message = answer["error"]
        raise TritonError(Code(code), message)
    return answer.get("ok")

"""The gevent internals we use, pinned (setup.cfg: gevent below the next major) and checked here.

If a gevent release moves one of them, this test names it, before anything hangs: the thread bridge
asks whether a native thread has a hub (``gevent._hub_local.get_hub_if_exists``, thread-local, never
creating one), and the socket shortcuts behind the fast-path switch use a gevent socket's ``_sock``,
``_wait`` and ``_read_event`` (runtime/socket_io.py).
"""

from __future__ import annotations

import gevent
from gevent import monkey, socket
from gevent._hub_local import get_hub_if_exists

_start_native = monkey.get_original("_thread", "start_new_thread")
_native_lock = monkey.get_original("_thread", "allocate_lock")


def test_get_hub_if_exists_is_per_thread_and_never_creates_one() -> None:
    seen: list[object] = []
    done = _native_lock()
    done.acquire()

    def probe() -> None:
        seen.append(get_hub_if_exists())
        gevent.get_hub()  # creates this thread's hub
        seen.append(get_hub_if_exists())
        done.release()

    _start_native(probe, ())
    assert done.acquire(timeout=10)
    assert seen[0] is None and seen[1] is not None
    assert seen[1] is not get_hub_if_exists()


def test_a_gevent_socket_has_the_internals_socket_io_uses() -> None:
    a, b = socket.socketpair()
    try:
        assert hasattr(a._sock, "send") and callable(a._wait)
        assert a._read_event is not None and a._read_event.ref in (True, False)
        b.sendall(b"x")
        a._wait(a._read_event)
        assert a.recv(1) == b"x"
    finally:
        a.close()
        b.close()


def test_stream_server_accept_hooks_exist() -> None:
    """frontends/descriptors.Listener overrides ``do_read`` (one accept) and sets ``max_accept``."""
    from gevent.baseserver import BaseServer
    from gevent.server import StreamServer

    assert callable(StreamServer.do_read) and isinstance(BaseServer.max_accept, int)
    assert all(callable(getattr(BaseServer, name)) for name in ("start_accepting", "stop_accepting"))

"""frontends/socket_io.py against a real (gevent) socket pair."""

from __future__ import annotations

import gevent
from gevent import socket

from triton_actor.frontends.socket_io import recv_when_readable, send_all


def test_send_all_more_than_the_kernel_takes_at_once() -> None:
    a, b = socket.socketpair()
    data = bytes(range(256)) * 40_000  # ~10 MB: several partial sends
    received = bytearray()

    def read() -> None:
        while len(received) < len(data):
            received.extend(b.recv(1 << 20))

    reader = gevent.spawn(read)
    send_all(a, data)
    reader.join(timeout=30)
    assert bytes(received) == data
    a.close()
    b.close()


def test_recv_when_readable_waits_for_data_and_sees_eof() -> None:
    a, b = socket.socketpair()
    gevent.spawn_later(0.05, a.sendall, b"hello")
    assert recv_when_readable(b, 100) == b"hello"
    a.close()
    assert recv_when_readable(b, 100) == b""
    b.close()

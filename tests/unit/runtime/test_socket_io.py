"""runtime/socket_io.py against a real (gevent) socket pair."""

from __future__ import annotations

import gevent
from gevent import socket

from triton_actor.runtime.socket_io import Woken, recv_when_readable, send_all, wake_reader


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


def test_a_woken_reader_answers_and_lingers_without_a_reset() -> None:
    """The reaper wakes a reader whose body is late; it answers, ends its side and reads on what the
    client still sends. With the read side shut instead, Linux answered those bytes with a reset and
    the client's next send failed (BrokenPipeError) before it read the answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    woken = gevent.spawn(lambda: server.recv(100))
    gevent.idle()  # the reader waits
    wake_reader(server)
    assert isinstance(woken.join(timeout=5) or woken.exception, Woken)
    server.sendall(b"HTTP/1.1 408")
    server.shutdown(socket.SHUT_WR)
    client.sendall(b"more of the body")  # blind, as a client that does not read while it sends
    assert server.recv(100) == b"more of the body"
    assert client.recv(100) == b"HTTP/1.1 408" and client.recv(100) == b""
    for s in (client, server, listener):
        s.close()


def test_wake_reader_without_a_reader_does_nothing() -> None:
    a, b = socket.socketpair()
    wake_reader(b)
    a.sendall(b"x")
    gevent.idle()
    assert b.recv(10) == b"x"
    a.close()
    b.close()

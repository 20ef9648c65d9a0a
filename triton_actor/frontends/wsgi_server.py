"""gevent's WSGI server with TCP_NODELAY on every accepted socket.

Without it gevent writes headers and body in separate sends and Nagle + delayed ACK stall every
response by 40 ms (feasibility §6).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from gevent.pywsgi import WSGIServer

log = logging.getLogger(__name__)


class _ErrorLog:
    """File-like adapter that sends pywsgi's error output to logging."""

    def write(self, text: str) -> None:
        text = text.rstrip()
        if text:
            log.error("%s", text)

    def flush(self) -> None:
        pass


class NoDelayWSGIServer(WSGIServer):
    """A pywsgi server that disables Nagle on accepted connections and logs no access lines."""

    def __init__(self, listener: Any, application: Any, **kwargs: Any) -> None:
        kwargs.setdefault("log", None)
        kwargs.setdefault("error_log", _ErrorLog())
        super().__init__(listener, application, **kwargs)

    def handle(self, sock: socket.socket, address: Any) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (e.g. a unix socket)
        super().handle(sock, address)

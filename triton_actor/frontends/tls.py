"""TLS for the gRPC port, as Triton's ``--grpc-use-ssl*`` flags configure it.

Triton's flags: ``--grpc-server-cert`` / ``--grpc-server-key`` (PEM) are the server's identity;
with ``--grpc-use-ssl-mutual`` a client must present a certificate that chains to
``--grpc-root-cert``. Both sides require ALPN ``h2`` (grpc-core and grpc-go refuse a TLS connection that
did not negotiate it; so does :func:`accept`), and TLS 1.2 is the floor HTTP/2 sets (RFC 9113 §9.2).
"""

from __future__ import annotations

import logging
import socket
import ssl

import gevent

log = logging.getLogger(__name__)


def server_context(cert: str, key: str, root_cert: str = "", mutual: bool = False) -> ssl.SSLContext:
    """A server-side context; raises ``OSError`` / ``ssl.SSLError`` for unreadable or bad files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if root_cert:
        context.load_verify_locations(root_cert)
    if mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class _HandshakeTimeout(OSError):
    pass


def accept(sock: socket.socket, context: ssl.SSLContext, timeout: float) -> ssl.SSLSocket | None:
    """The server side of the handshake on an accepted socket, within ``timeout`` seconds in all
    (a client that says nothing, or drips its ClientHello a byte per read, is dropped); None when
    it fails. Runs in the connection's greenlet."""
    sock.settimeout(timeout)
    try:
        # the socket timeout is per read; this one is the handshake's. An OSError, so that the
        # half-made SSLSocket closes the descriptor it took over (it lets other exceptions through)
        with gevent.Timeout(timeout, _HandshakeTimeout(f"TLS handshake not done within {timeout} s")):
            wrapped = context.wrap_socket(sock, server_side=True)
    except (OSError, ssl.SSLError) as e:
        log.debug("TLS handshake failed: %s", e)
        return None
    if wrapped.selected_alpn_protocol() != "h2":
        # a client that offered no ALPN, or only other protocols (OpenSSL then goes on without one):
        # refused, as grpc-go (1.67 on) and grpc-core refuse a TLS connection that did not agree on h2
        log.debug("TLS client did not negotiate ALPN h2: closed")
        _close(wrapped)
        return None
    wrapped.settimeout(None)
    return wrapped


def _close(wrapped: ssl.SSLSocket) -> None:
    try:
        wrapped.close()
    except OSError:
        pass

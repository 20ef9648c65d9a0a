"""The metrics endpoint: ``GET /metrics`` on its own port (``--metrics-port``, Triton's 8002).

A gevent WSGI server (``gevent.pywsgi``), startable on ``(address, port)`` or on a listening socket handed
down (gunicorn gives its workers sockets). Each scrape runs in its own request greenlet: it gathers every
worker's snapshot through the host (``host.gather("metrics")``) and renders them; nothing here touches
the inference hot path. Owner: the server of the process that serves metrics; it also owns the
:class:`~triton_actor.metrics.system.SystemSampler`. Failure: a scrape that fails answers 500 with the
error and the next scrape starts afresh.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

from gevent.pywsgi import WSGIServer

from ..host import Host
from ..metrics.config import MetricsConfig
from ..metrics.exposition import CONTENT_TYPE, render
from ..metrics.families import TritonCollector
from ..metrics.system import SystemSampler

log = logging.getLogger(__name__)


class MetricsServer:
    """``/metrics`` for the host's totals."""

    def __init__(self, host: Host, config: MetricsConfig, listener: socket.socket | tuple[str, int],
                 interval_s: float = 2.0) -> None:
        self.sampler = SystemSampler(interval_s)
        self.collector = TritonCollector(lambda: host.gather("metrics"), config, lambda: self.sampler.values)
        self._wsgi = WSGIServer(listener, self._app, log=None, error_log=None)

    @property
    def server_port(self) -> int:
        return self._wsgi.server_port

    def start(self) -> int:
        self.sampler.start()
        self._wsgi.start()
        return self.server_port

    def stop(self) -> None:
        self.sampler.stop()
        self._wsgi.stop(timeout=1)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are served at /metrics\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET")])
            return [b"method not allowed\n"]
        try:
            body = render(self.collector)
        except Exception as e:  # a failed scrape is this scrape's 500, not the server's end
            log.exception("metrics scrape failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [f"metrics scrape failed: {e!r}\n".encode()]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [body]

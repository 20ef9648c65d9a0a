"""The metrics endpoint: ``GET /metrics`` on its own port (``--metrics-port``, Triton's 8002).

Served by our HTTP/1.1 driver (:class:`.http_server.HttpServer`) and router (:class:`.http.HttpFrontend`)
over a url map of its own, so the metrics port has the bounds of the HTTP port: ``--http-max-connections``
and the header, body and keep-alive timeouts (a client half-sending request heads cannot hold its
connections open for ever, as it could under ``gevent.pywsgi``). No route here takes a body, so bodies
are refused past :data:`MAX_BODY`. Startable on ``(address, port)`` or on a listening socket handed
down (gunicorn gives its workers sockets).

Each scrape runs in its connection's greenlet: it gathers every worker's snapshot through the host
(``host.gather("metrics")``) and renders them; nothing here touches the inference hot path. Owner: the
server of the process that serves metrics; it also owns the :class:`~triton_actor.metrics.system.SystemSampler`.
Failure: a scrape that fails answers 500 with the error and the next scrape starts afresh.
"""

from __future__ import annotations

import dataclasses
import logging
import socket

from ..host import Host
from ..metrics.config import MetricsConfig
from ..metrics.exposition import CONTENT_TYPE, render
from ..metrics.families import TritonCollector
from ..metrics.system import SystemSampler
from ..protocol import http1
from .descriptors import ConnectionSlots
from .http import TEXT_HEADERS, HttpFrontend, HttpRequest, Reply
from .http_routes import empty_app
from .http_server import HttpServer

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # a scrape is a GET: nothing on this port needs a body, so none is buffered whole
# Scrapers hold a connection or two each: a small cap keeps this port from taking the descriptors that
# the HTTP and gRPC ports share with it (descriptors.py)
MAX_CONNECTIONS = 64
_HEADERS = [("Content-Type", CONTENT_TYPE)]


class MetricsServer:
    """``/metrics`` for the host's totals; ``limits`` are the HTTP port's (the body limit lowered to
    :data:`MAX_BODY`); at most :data:`MAX_CONNECTIONS`, each a slot of ``slots`` (the process's)."""

    def __init__(self, host: Host, config: MetricsConfig, listener: socket.socket | tuple[str, int],
                 interval_s: float = 2.0, limits: http1.Limits = http1.DEFAULT_LIMITS,
                 slots: ConnectionSlots | None = None) -> None:
        self.sampler = SystemSampler(interval_s)
        self.collector = TritonCollector(lambda: host.gather("metrics"), config, lambda: self.sampler.values)
        app = empty_app()
        app.add_url_rule("/metrics", "metrics", self._scrape, methods=["GET"])  # HEAD comes with GET
        limits = dataclasses.replace(limits, max_body=min(limits.max_body, MAX_BODY))
        address, port = listener if isinstance(listener, tuple) else ("", 0)
        handed_down = None if isinstance(listener, tuple) else listener
        self._http = HttpServer(address, port, HttpFrontend(app, MAX_BODY, name="metrics"), limits,
                                MAX_CONNECTIONS, handed_down, slots=slots, name="metrics")

    @property
    def server_port(self) -> int:
        return self._http.server_port

    def start(self) -> int:
        self.sampler.start()
        self._http.start()
        return self.server_port

    def stop(self) -> None:
        self.sampler.stop()
        self._http.stop(timeout=1)

    def _scrape(self, req: HttpRequest) -> Reply:
        try:
            body = render(self.collector)
        except Exception as e:  # a failed scrape is this scrape's 500, not the server's end
            log.exception("metrics scrape failed")
            return "500 Internal Server Error", TEXT_HEADERS, f"metrics scrape failed: {e!r}\n".encode()
        return "200 OK", _HEADERS, body

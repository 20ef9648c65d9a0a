"""The metrics endpoint: ``GET /metrics`` on its own port (``--metrics-port``, Triton's 8002).

Served by our HTTP/1.1 driver (:class:`.http_server.HttpServer`) and router (:class:`.http.HttpFrontend`)
over a url map of its own, so the metrics port has the bounds of the HTTP port: ``--http-max-connections``
and the header, body and keep-alive timeouts (a client half-sending request heads cannot hold its
connections open for ever, as it could under ``gevent.pywsgi``). No route here takes a body, so bodies
are refused past :data:`MAX_BODY`. Startable on ``(address, port)`` or on a listening socket handed
down (gunicorn gives its workers sockets).

Each scrape runs in its connection's greenlet: it gathers every worker's snapshot through the host
(``host.gather("metrics")``) and renders them; nothing here touches the inference hot path. Scrapes share
renders (:class:`SharedRender`): one render at a time, each started after the scrapes it answers arrived
(so every answer is fresh), and a pause of :data:`RENDER_GAP` times the last render's length before the
next, so any number of scrapers take at most a fifth of the hub. Owner: the
server of the process that serves metrics; it also owns the :class:`~triton_actor.metrics.system.SystemSampler`.
Failure: a scrape that fails answers 500 with the error and the next scrape starts afresh.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Callable

import gevent
from gevent.event import AsyncResult

from ..host.base import Host
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
# the hub's idle time between two renders, in renders: 64 connections scraping back to back took the
# hub whole (a render of the 13 example models is ~1.3 ms), and small /infer answers waited 89 ms
RENDER_GAP = 4.0
# at most this pause: a render's length is wall time, and with several workers it includes waiting for the
# others' snapshots (up to the gather's 10 s), when the hub is free; 4 x that held every scrape for 40 s
MAX_PAUSE_S = 0.25
_HEADERS = [("Content-Type", CONTENT_TYPE)]


class SharedRender:
    """Renders shared by the scrapes that wait for them. A scrape joins the next render if one is
    waiting to start (never one that started before it came), else it is that next render: it waits for
    the one running, then for the gap, then renders for everyone who joined meanwhile. Hub greenlets
    only (the connections'); ``clock`` is injectable for tests."""

    def __init__(self, render_fn: Callable[[], bytes], gap: float = RENDER_GAP,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._render = render_fn
        self._gap = gap
        self._clock = clock
        self._running: AsyncResult | None = None  # the render under way
        self._next: AsyncResult | None = None  # the render the scrapes that came since wait for
        self._earliest = 0.0  # when the next render may start
        self.renders = 0

    def __call__(self) -> bytes:
        if self._next is not None:
            return self._next.get()  # its exception too
        mine = self._next = AsyncResult()
        try:
            while self._running is not None:
                self._running.wait()
            wait = self._earliest - self._clock()
            if wait > 0:
                gevent.sleep(wait)
        except BaseException as e:  # killed while waiting: those who joined get an answer all the same
            self._next = None
            mine.set_exception(RuntimeError(f"scrape interrupted: {e!r}"))
            raise
        self._next, self._running = None, mine
        started = self._clock()
        try:
            body = self._render()
        except BaseException as e:
            mine.set_exception(e if isinstance(e, Exception) else RuntimeError(f"scrape interrupted: {e!r}"))
            raise
        else:
            mine.set(body)
            return body
        finally:
            self.renders += 1
            ended = self._clock()
            self._earliest = ended + min(MAX_PAUSE_S, self._gap * (ended - started))
            self._running = None


class MetricsServer:
    """``/metrics`` for the host's totals; ``limits`` are the HTTP port's (the body limit lowered to
    :data:`MAX_BODY`); at most :data:`MAX_CONNECTIONS`, each a slot of ``slots`` (the process's)."""

    def __init__(self, host: Host, config: MetricsConfig, listener: socket.socket | tuple[str, int],
                 interval_s: float = 2.0, limits: http1.Limits = http1.DEFAULT_LIMITS,
                 slots: ConnectionSlots | None = None, cpu: bool = True, gpu: bool = True) -> None:
        self.sampler = SystemSampler(interval_s, cpu, gpu)  # cpu / gpu: --allow-cpu-metrics, --allow-gpu-metrics
        self.collector = TritonCollector(lambda: host.gather("metrics"), config, lambda: self.sampler.values)
        self._shared = SharedRender(lambda: render(self.collector))
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
            body = self._shared()
        except Exception as e:  # a failed scrape is this scrape's 500, not the server's end
            log.exception("metrics scrape failed")
            return "500 Internal Server Error", TEXT_HEADERS, f"metrics scrape failed: {e!r}\n".encode()
        return "200 OK", _HEADERS, body

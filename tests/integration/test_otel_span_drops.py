"""Spans OpenTelemetry mode does not export are counted on ``/metrics`` (``nv_trace_spans_dropped_total``,
observability/otel.py): those dropped because the export queue was full while the collector held a post,
and those of a post the collector refused. Every span a request makes is either received or counted."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import gevent.event
import pytest

from .test_ensemble import pipeline
from .test_otel_traces import Receiver, _flags, _http_infer

pytestmark = pytest.mark.timeout(120)
SPANS_PER_REQUEST = 3  # InferRequest, the model's span, compute


class GatedReceiver(Receiver):
    """Holds the first post until the test sets ``gate``; answers ``status`` to every post."""

    def __init__(self, status: str = "200 OK") -> None:
        self.gate = gevent.event.Event()
        self.entered = gevent.event.Event()
        self.status = status
        super().__init__()

    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        self.entered.set()
        self.gate.wait()
        if self.status.startswith("200"):
            return super()._app(environ, start_response)
        environ["wsgi.input"].read()
        self.arrived.set()
        start_response(self.status, [("Content-Type", "text/plain"), ("Content-Length", "0")])
        return [b""]


def _dropped(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        text = r.read().decode()
    assert "# TYPE nv_trace_spans_dropped_total counter" in text
    return {reason: float(v) for reason, v in
            re.findall(r'^nv_trace_spans_dropped_total\{reason="(\w+)"\} (\S+)$', text, re.MULTILINE)}


def test_spans_dropped_while_the_collector_holds_a_post_are_counted(tmp_path: Path, start_server) -> None:
    receiver = GatedReceiver()
    pipeline(tmp_path)
    flags = (*_flags(receiver, rate=1), "--trace-config", "opentelemetry,bsp_max_queue_size=4",
             "--trace-config", "opentelemetry,bsp_max_export_batch_size=1")
    server = start_server(tmp_path, flags=flags)
    try:
        assert _dropped(server.metrics_url) == {"queue_full": 0.0, "export_failed": 0.0}
        _http_infer(server, "inc")
        assert receiver.entered.wait(30)  # the export thread is in its first post, held
        requests = 6
        for _ in range(requests - 1):  # 15 spans in 10 records for a queue of 4: some are dropped
            _http_infer(server, "inc")
        held = _dropped(server.metrics_url)
        assert held["queue_full"] > 0 and held["export_failed"] == 0
        receiver.gate.set()
        # every span either reaches the collector or is counted, none twice (the last request's InferRequest
        # span ends after its answer's send: it may be dropped after the read above, never after the release)
        receiver.wait_for(lambda: len(receiver.spans) + _dropped(server.metrics_url)["queue_full"]
                          == requests * SPANS_PER_REQUEST)
        assert _dropped(server.metrics_url)["export_failed"] == 0
    finally:
        receiver.gate.set()
        receiver.server.stop()


def test_spans_of_a_post_the_collector_refuses_are_counted(tmp_path: Path, start_server) -> None:
    receiver = GatedReceiver("400 Bad Request")  # not retried by the exporter
    receiver.gate.set()
    pipeline(tmp_path)
    server = start_server(tmp_path, flags=_flags(receiver, rate=1))
    try:
        for _ in range(2):
            _http_infer(server, "inc")
        # the count follows the refused post's answer: read until it is there (each read waits for a post
        # to arrive or for a tenth of a second)
        with gevent.Timeout(30, AssertionError("the failed spans were never counted")):
            while _dropped(server.metrics_url)["export_failed"] < 2 * SPANS_PER_REQUEST:
                receiver.arrived.wait(0.1)
                receiver.arrived.clear()
        assert _dropped(server.metrics_url) == {"queue_full": 0.0, "export_failed": 2.0 * SPANS_PER_REQUEST}
    finally:
        receiver.server.stop()

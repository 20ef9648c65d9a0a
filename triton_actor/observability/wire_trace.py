"""A request's time on the wire, as Triton's front ends stamp it on the ``InferRequest`` span in
OpenTelemetry mode (server ``src/tracer.cc``: ``Trace::CaptureTimestamp`` adds an event to the root span).

Triton's HTTP front end stamps ``HTTP_RECV_START`` and ``HTTP_RECV_END`` (the request read), its gRPC one
``GRPC_WAITREAD_START`` and ``GRPC_WAITREAD_END`` (the call's read of its message); both stamp
``INFER_RESPONSE_COMPLETE`` when the core hands the response back and ``<front>_SEND_START`` and
``<front>_SEND_END`` around its send; the root span ends when the trace is released, after the send
(Triton's QA ``opentelemetry_unittest.py`` checks these five events on the root span and no others).

Who owns what: a front end makes one :class:`WireTrace` per unary inference request, only while the
server traces in OpenTelemetry mode (one attribute check per request otherwise), and hands it to the data
plane in place of the ``traceparent`` string. When the request is sampled the plane gives it the root
span (:meth:`begun`) and stamps the response (:meth:`answered`); the front end ends the span after its
send (:meth:`sent`, called on every way out, so a root span is always exported). Not sampled: every
call here does nothing. Hub only; stamps are ``time.perf_counter_ns``, converted to wall-clock time by
the export's batch thread as the other spans' stamps are (observability/otel.py).

Trace files (mode=triton) get the same receive and send stamps, as Triton's ``Trace::CaptureTimestamp``
writes them to the trace's stream: the front ends make a WireTrace while a file sampler is active too
(``Tracer.wired``), the scheduler that samples the request hands it the trace's entries (:meth:`hold`)
in place of writing them, and :meth:`sent` writes them with the stamps, once the answer is out (Triton
writes a trace when it is released, after the send).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from ..protocol import trace_json

# the front end's names for its receive events (Triton's http_server.cc and grpc infer handler)
_RECV = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"), "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")}


class WireTrace:
    """One request's front-end stamps, and its ``InferRequest`` span once the plane sampled it."""

    __slots__ = ("front", "traceparent", "recv_start", "recv_end", "send_start", "root", "held")

    def __init__(self, front: str, traceparent: str | None, recv_start: int) -> None:
        """``front``: ``"HTTP"`` or ``"GRPC"``; ``recv_start``: when its request began to arrive."""
        self.front, self.traceparent, self.recv_start = front, traceparent, recv_start
        self.recv_end = recv_start  # the front end sets it once the request is read
        self.send_start = 0
        self.root: Any = None  # the InferRequest span (otel.Span: sampled and not yet ended)
        self.held: tuple[Any, Any, list[dict[str, Any]]] | None = None  # (tracer, sampler, entries): mode=triton

    def hold(self, tracer: Any, sampler: Any, entries: list[dict[str, Any]]) -> None:
        """Trace file: the sampled request's entries (its header first), written by :meth:`sent`."""
        self.held = (tracer, sampler, entries)

    def begun(self, root: Any) -> None:
        """The plane sampled the request: ``root`` is its span."""
        self.root = root
        start, end = _RECV[self.front]
        root.events += ((start, self.recv_start), (end, self.recv_end))

    def answered(self) -> None:
        """The response is ready (the model answered or failed): Triton's ``INFER_RESPONSE_COMPLETE``."""
        if self.root is not None:
            self.root.events.append(("INFER_RESPONSE_COMPLETE", perf_counter_ns()))

    def sending(self) -> None:
        """The front end starts to send the answer."""
        self.send_start = perf_counter_ns()

    def sent(self) -> None:
        """The answer is sent, or the request ended without one: the send events (when it was sent)
        and the span's end. Once; later calls (and a response after it) do nothing."""
        if self.held is not None:
            self._write()
        root, self.root = self.root, None
        if root is None:
            return
        now = perf_counter_ns()
        if self.send_start:
            root.events += ((f"{self.front}_SEND_START", self.send_start), (f"{self.front}_SEND_END", now))
        root.end(now)

    def _write(self) -> None:
        """The held trace, with Triton's stamps around the core's: receive before, send after."""
        (tracer, sampler, entries), self.held = self.held, None
        trace_id = entries[0]["id"]
        stamps = list(zip(_RECV[self.front], (self.recv_start, self.recv_end), strict=True))
        sent = []
        if self.send_start:
            sent = [(f"{self.front}_SEND_START", self.send_start), (f"{self.front}_SEND_END", perf_counter_ns())]
        tracer.emit(sampler, [entries[0], *trace_json.timestamps(trace_id, stamps), *entries[1:],
                              *trace_json.timestamps(trace_id, sent)])

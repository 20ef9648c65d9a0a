"""A request's time on the wire, as Triton's front ends stamp it on the ``InferRequest`` span in
OpenTelemetry mode (server ``src/tracer.cc``: ``Trace::CaptureTimestamp`` adds an event to the root span).

Triton's HTTP front end stamps ``HTTP_RECV_START`` and ``HTTP_RECV_END`` (the request read), its gRPC one
``GRPC_WAITREAD_START`` and ``GRPC_WAITREAD_END`` (the call's read of its message); both stamp
``INFER_RESPONSE_COMPLETE`` when the core hands the response back and ``<front>_SEND_START`` and
``<front>_SEND_END`` around its send; the root span ends when the trace is released, after the send
(Triton's QA ``opentelemetry_unittest.py`` checks these five events on the root span and no others).

Who owns what: a front end makes one :class:`WireTrace` per inference request (a unary call, an HTTP
request, each request message of a gRPC stream), only while the server traces (one attribute check per
request otherwise), and hands it to the data plane in place of the ``traceparent`` string. When the request is sampled the plane gives it the root
span (:meth:`begun`) and stamps the response (:meth:`answered`); the front end ends the span after its
send (:meth:`sent`, called on every way out, so a root span is always exported). Not sampled: every
call here does nothing. A stream's request (Triton's ``ModelStreamInferHandler``) has a send pair per
response it sends (:meth:`sending`, :meth:`written`) and ``INFER_RESPONSE_COMPLETE`` at its first; its
span ends after its last send. Hub only; stamps are ``time.perf_counter_ns``, converted to wall-clock time by
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

    __slots__ = ("front", "traceparent", "recv_start", "recv_end", "send_start", "sends", "answered_ns", "root",
                 "held", "over")

    def __init__(self, front: str, traceparent: str | None, recv_start: int) -> None:
        """``front``: ``"HTTP"`` or ``"GRPC"``; ``recv_start``: when its request began to arrive."""
        self.front, self.traceparent, self.recv_start = front, traceparent, recv_start
        self.recv_end = recv_start  # the front end sets it once the request is read
        self.send_start = 0
        self.sends: list[tuple[int, int]] = []  # (start, end) of each message sent before the last
        self.answered_ns = 0
        self.over = False  # sent() ran: a trace held after it is written at once
        self.root: Any = None  # the InferRequest span (otel.Span: sampled and not yet ended)
        self.held: tuple[Any, Any, list[dict[str, Any]]] | None = None  # (tracer, sampler, entries): mode=triton

    def hold(self, tracer: Any, sampler: Any, entries: list[dict[str, Any]]) -> None:
        """Trace file: the sampled request's entries (its header first), written by :meth:`sent` (at once
        when that ran already: a decoupled model's batch may complete after its last response was sent)."""
        self.held = (tracer, sampler, entries)
        if self.over:
            self._write()

    def begun(self, root: Any) -> None:
        """The plane sampled the request: ``root`` is its span."""
        self.root = root
        start, end = _RECV[self.front]
        root.events += ((start, self.recv_start), (end, self.recv_end))

    def answered(self) -> None:
        """The response is ready (the model answered or failed): Triton's ``INFER_RESPONSE_COMPLETE``,
        once (a stream's request: at its first response)."""
        if self.root is not None and not self.answered_ns:
            self.answered_ns = perf_counter_ns()
            self.root.events.append(("INFER_RESPONSE_COMPLETE", self.answered_ns))

    def sending(self) -> None:
        """The front end starts to send the answer (or a stream's request's next response)."""
        self.send_start = perf_counter_ns()

    def written(self) -> None:
        """A stream's response is sent: its send pair is kept for :meth:`sent`."""
        if self.send_start:
            self.sends.append((self.send_start, perf_counter_ns()))
            self.send_start = 0

    def sent(self) -> None:
        """The answer is sent, or the request ended without one: the send events (when it was sent)
        and the span's end. Once; later calls (and a response after it) do nothing."""
        if self.over:
            return
        self.over = True
        self.written()  # the last send ends now (a unary answer's only one)
        if self.held is not None:
            self._write()
        root, self.root = self.root, None
        if root is not None:
            root.events += self._send_stamps()
            root.end(self.sends[-1][1] if self.sends else perf_counter_ns())

    def _send_stamps(self) -> list[tuple[str, int]]:
        start, end = f"{self.front}_SEND_START", f"{self.front}_SEND_END"
        return [stamp for s, e in self.sends for stamp in ((start, s), (end, e))]

    def _write(self) -> None:
        """The held trace, with Triton's stamps around the core's: receive before, send after."""
        (tracer, sampler, entries), self.held = self.held, None
        trace_id = entries[0]["id"]
        stamps = list(zip(_RECV[self.front], (self.recv_start, self.recv_end), strict=True))
        tracer.emit(sampler, [entries[0], *trace_json.timestamps(trace_id, stamps), *entries[1:],
                              *trace_json.timestamps(trace_id, self._send_stamps())])

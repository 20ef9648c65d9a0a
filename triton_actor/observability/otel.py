"""OpenTelemetry export of request traces, as Triton's ``--trace-config mode=opentelemetry`` (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/trace.md, "OpenTelemetry trace support"; server ``src/tracer.cc``).

The span tree is Triton's: one ``InferRequest`` span per request (kind SERVER; the child of the W3C
``traceparent`` the client sent, if any), under it one span named after the model (attributes
``triton.model_name``, ``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id``,
``triton.request_id``; events ``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``) and under that one
``compute`` span (events ``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``,
``COMPUTE_END``). An ensemble's model span is the parent of its steps' model spans. A BLS request a
model makes with ``trace=request.trace()`` (as Triton asks) is a child trace: its model span hangs from
the caller's ``compute`` span (:meth:`SpanTrace.bls_child`), as Triton's span stack makes it.

Who owns what: the server's :class:`~.tracing.Tracer` holds one :class:`OtelExport` (built once at
start-up, as Triton builds its provider once); a sampled request carries a :class:`SpanTrace` in
``InferRequest.trace``: where its model span goes. Spans of a model are made when its batch completes,
with the stamps the scheduler took (``trace_json.stage_times``), converted to wall-clock time as Triton
offsets its steady-clock stamps. A caller's compute span does not exist yet while its BLS calls run, so
its span id is drawn when the first child needs it and given to the span when it is made
(:class:`_Ids`, the provider's id generator, told the id right before that one span starts).

The SDK is imported here only, and this module only when the mode is ``opentelemetry``: a server
tracing to a file, or not at all, pays nothing. Threads: every call here runs on the hub and only hands
ended spans to the SDK's BatchSpanProcessor, whose own native thread batches and posts them (OTLP/HTTP
protobuf); :meth:`OtelExport.shutdown` blocks and is called in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

TRACER_NAME = "triton-server"  # Triton's kTritonTracer
DEFAULT_URL = "http://localhost:4318/v1/traces"
_SERVICE = "triton-inference-server"
_BSP = {"bsp_max_queue_size": "max_queue_size", "bsp_schedule_delay": "schedule_delay_millis",
        "bsp_max_export_batch_size": "max_export_batch_size"}
_MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})


def parse_setting(setting: str, into: dict[str, Any]) -> None:
    """One ``--trace-config opentelemetry,KEY=VALUE`` into ``into`` (``resource`` may repeat, one
    ``key=value`` each, as Triton takes it). Raises ValueError."""
    key, _, value = setting.partition("=")
    if key == "url":
        into["url"] = value
    elif key == "resource":
        name, sep, attr = value.partition("=")
        if not sep or not name:
            raise ValueError(f"resource must be key=value, not '{value}'")
        into.setdefault("resource", {})[name] = attr
    elif key in _BSP:
        if not value.isdigit():
            raise ValueError(f"'{value}' is not an unsigned integer")
        into[key] = int(value)
    else:
        raise ValueError(f"unknown opentelemetry setting '{key}'")


class OtelExport:
    """The SDK's provider, batch processor and OTLP/HTTP exporter of one server."""

    def __init__(self, settings: dict[str, Any], next_id: Callable[[], int]) -> None:
        """``next_id``: the tracer's trace ids (Triton's ``triton.trace_id``), one per model span."""
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # Triton's defaults first; OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) and the flags over them
        resource = Resource.create({"service.name": _SERVICE, **settings.get("resource", {})})
        # ALWAYS_ON: a propagated context is traced whatever its sampled flag says, as Triton forces it
        self.ids = _ids(RandomIdGenerator)()
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, id_generator=self.ids)
        bsp = {arg: settings[key] for key, arg in _BSP.items() if key in settings}
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(settings.get("url", DEFAULT_URL)), **bsp))
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self._propagator = TraceContextTextMapPropagator()
        self._in_context = trace.set_span_in_context
        self._is_valid = lambda ctx: trace.get_current_span(ctx).get_span_context().is_valid
        self._span_context = lambda ctx: trace.get_current_span(ctx).get_span_context()
        self._reserved = lambda trace_id, span_id: trace.set_span_in_context(trace.NonRecordingSpan(
            trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))))
        self.kind = trace.SpanKind.SERVER
        self.next_id = next_id
        self.offset = time.time_ns() - time.perf_counter_ns()  # perf_counter stamps → wall clock

    def extract(self, traceparent: str | None) -> Any:
        """The context a W3C ``traceparent`` names; None when absent or invalid."""
        if not traceparent:
            return None
        ctx = self._propagator.extract({"traceparent": traceparent})
        return ctx if self._is_valid(ctx) else None

    def begin(self, parent: Any, start_ns: int) -> tuple[Any, SpanTrace]:
        """A sampled request's ``InferRequest`` span and the :class:`SpanTrace` its model span hangs from."""
        root = self.tracer.start_span("InferRequest", context=parent, kind=self.kind, start_time=start_ns + self.offset)
        return root, SpanTrace(self, self._in_context(root), self.next_id(), 0)

    def shutdown(self) -> None:
        """Export what is queued and stop the processor's thread (blocks: call it in a worker thread)."""
        self.provider.shutdown()


def _ids(base: type) -> type:
    class _Ids(base):  # type: ignore[valid-type,misc]
        """The SDK's random ids, but for the one span whose id was drawn before it started (``forced``)."""

        forced = 0

        def generate_span_id(self) -> int:
            forced, self.forced = self.forced, 0
            return forced or super().generate_span_id()

    return _Ids


class SpanTrace:
    """What a traced request carries: the context its model span is a child of, and Triton's trace ids.
    ``compute_id``: its compute span's id, drawn early for the BLS calls made in that compute (0: none)."""

    __slots__ = ("export", "context", "trace_id", "parent_id", "compute_id")

    def __init__(self, export: OtelExport, context: Any, trace_id: int, parent_id: int) -> None:
        self.export, self.context, self.trace_id, self.parent_id = export, context, trace_id, parent_id
        self.compute_id = 0

    def model_span(self, model: str, version: int, request_id: str, start_ns: int) -> Any:
        """Start the model span at ``start_ns`` (perf_counter) with Triton's attributes."""
        attrs: dict[str, Any] = {"triton.model_name": model, "triton.model_version": version,
                                 "triton.trace_id": self.trace_id, "triton.trace_parent_id": self.parent_id}
        if request_id:
            attrs["triton.request_id"] = request_id
        export = self.export
        return export.tracer.start_span(model, context=self.context, kind=export.kind, attributes=attrs,
                                        start_time=start_ns + export.offset)

    def record(self, model: str, version: int, request_id: str, stamps: list[tuple[str, int]]) -> None:
        """A request that ran on ``model``: its model span and compute span from the seven stage stamps."""
        offset = self.export.offset
        span = self.model_span(model, version, request_id, stamps[0][1])
        compute = None
        for name, ns in stamps:
            if name == "COMPUTE_START":
                self.export.ids.forced = self.compute_id  # the id its BLS children name as parent (or 0)
                compute = self.export.tracer.start_span("compute", context=self.export._in_context(span),
                                                        kind=self.export.kind, start_time=ns + offset)
            (span if name in _MODEL_EVENTS or compute is None else compute).add_event(name, timestamp=ns + offset)
            if name == "COMPUTE_END" and compute is not None:
                compute.end(end_time=ns + offset)
        span.end(end_time=stamps[-1][1] + offset)

    def open(self, model: str, version: int, request_id: str, start_ns: int) -> tuple[Any, SpanTrace]:
        """An ensemble's model span, started at ``start_ns``, and the trace whose :meth:`spawn` gives
        each step the ensemble span as parent (Triton's child traces: a new trace id each)."""
        span = self.model_span(model, version, request_id, start_ns)
        for name in ("REQUEST_START", "QUEUE_START"):
            span.add_event(name, timestamp=start_ns + self.export.offset)
        return span, SpanTrace(self.export, self.export._in_context(span), self.trace_id, self.parent_id)

    def spawn(self) -> SpanTrace:
        return SpanTrace(self.export, self.context, self.export.next_id(), self.trace_id)

    def bls_child(self) -> SpanTrace:
        """The trace of a BLS request this request's model makes (hub): a child trace whose model span
        is a child of this request's compute span, as Triton parents a child trace's request span on
        the top of its parent's span stack (``tracer.cc``: the compute span while the model runs)."""
        export = self.export
        if not self.compute_id:
            self.compute_id = export.ids.generate_span_id()
        parent = export._reserved(export._span_context(self.context).trace_id, self.compute_id)
        return SpanTrace(export, parent, export.next_id(), self.trace_id)

    def close(self, span: Any, events: tuple[str, ...] = ("REQUEST_END",)) -> None:
        """End ``span`` now, after ``events`` stamped now (an ensemble's REQUEST_END; none for the root)."""
        now = time.perf_counter_ns() + self.export.offset
        for name in events:
            span.add_event(name, timestamp=now)
        span.end(end_time=now)

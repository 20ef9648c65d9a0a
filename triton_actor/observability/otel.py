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
offsets its steady-clock stamps.

Threads: the hub only records what a span is (plain tuples: names, ids, ``perf_counter`` stamps,
attributes, parent) and puts the record in a :class:`~..runtime.batch_thread.BatchThread`; that native
thread writes the OTLP protobuf straight from the records (:mod:`..protocol.otlp`: no SDK span objects,
no SDK encoder) and posts it through the SDK's OTLP/HTTP exporter's client, ``bsp_max_export_batch_size``
spans a post, every ``bsp_schedule_delay`` ms or as soon as that many records wait (the settings of the
SDK's BatchSpanProcessor, whose job it does). Making spans through the SDK's tracer on the hub cost 190 to
270 us of hub CPU per request, and building the SDK's objects and encoding them on the thread another 160
us that the thread held the GIL for (docs/performance.md, "OpenTelemetry spans built off the hub" and
"OpenTelemetry spans encoded from the records"). The ids are made on the hub, since children name their
parents: random bits from ``random.getrandbits``, as the SDK's ``RandomIdGenerator`` draws them.
:meth:`OtelExport.shutdown` blocks and is called in a worker thread. Spans lost (the queue full, a post
that failed) are counted on ``/metrics`` (:data:`DROPPED_FAMILY`).

The SDK is imported here only, and this module only when the mode is ``opentelemetry``: a server
tracing to a file, or not at all, pays nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from random import getrandbits
from typing import Any

from ..protocol.otlp import TraceEncoder
from ..runtime.batch_thread import BatchThread

log = logging.getLogger(__name__)

TRACER_NAME = "triton-server"  # Triton's kTritonTracer
DEFAULT_URL = "http://localhost:4318/v1/traces"
_SERVICE = "triton-inference-server"
DROPPED_FAMILY = "nv_trace_spans_dropped_total"  # ours, not Triton's (docs/metrics.md)
# our flags, the SDK's environment variables for them and their defaults (BatchSpanProcessor's)
_BSP = {"bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 2048), "bsp_schedule_delay": ("OTEL_BSP_SCHEDULE_DELAY", 5000),
        "bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)}
_MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
_SPAN, _RUN = 0, 1  # the records' kinds: one span (Span.end), a model's span and its compute span (record)


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


def _bsp(settings: dict[str, Any], key: str) -> int:
    """A batch setting: the flag, else the SDK's environment variable, else the SDK's default."""
    if key in settings:
        return int(settings[key])
    env, default = _BSP[key]
    try:
        return int(os.environ.get(env, default))
    except ValueError:
        return default


def _span_id() -> int:
    span_id = getrandbits(64)
    while not span_id:  # 0 is the invalid id
        span_id = getrandbits(64)
    return span_id


def _trace_id() -> int:
    trace_id = getrandbits(128)
    while not trace_id:
        trace_id = getrandbits(128)
    return trace_id


class OtelExport:
    """One server's OTLP/HTTP exporter and the thread that encodes and posts its spans."""

    def __init__(self, settings: dict[str, Any], next_id: Callable[[], int]) -> None:
        """``next_id``: the tracer's trace ids (Triton's ``triton.trace_id``), one per model span."""
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # Triton's defaults first; OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) and the flags over them
        resource = Resource.create({"service.name": _SERVICE, **settings.get("resource", {})})
        # the exporter posts (its endpoint, headers, compression, TLS, timeout and retries, from the flags
        # and the OTEL_EXPORTER_OTLP_* variables); the bytes are ours (protocol/otlp.py)
        self._exporter = OTLPSpanExporter(settings.get("url", DEFAULT_URL))
        self._post = _poster(self._exporter)
        self._propagator = TraceContextTextMapPropagator()
        self._current = trace.get_current_span
        self._batch = _bsp(settings, "bsp_max_export_batch_size") or 512
        self.offset = time.time_ns() - time.perf_counter_ns()  # perf_counter stamps → wall clock
        self._encoder = TraceEncoder(dict(resource.attributes), TRACER_NAME, self.offset)
        self.failed = 0  # spans in posts that failed (export thread)
        self.thread = BatchThread("OpenTelemetry spans", self._export, _bsp(settings, "bsp_max_queue_size"),
                                  self._batch, _bsp(settings, "bsp_schedule_delay") / 1000, weigh=_spans_in)
        self.put = self.thread.put
        self.next_id = next_id

    def extract(self, traceparent: str | None) -> tuple[int, int] | None:
        """The (trace id, span id) a W3C ``traceparent`` names; None when absent or invalid."""
        if not traceparent:
            return None
        ctx = self._current(self._propagator.extract({"traceparent": traceparent})).get_span_context()
        return (ctx.trace_id, ctx.span_id) if ctx.is_valid else None

    def begin(self, parent: tuple[int, int] | None, start_ns: int) -> tuple[Span, SpanTrace]:
        """A sampled request's ``InferRequest`` span and the :class:`SpanTrace` its model span hangs from.
        ``parent``: the client's context (:meth:`extract`), a remote parent."""
        if parent is None:
            root = Span(self, "InferRequest", _trace_id(), 0, False, start_ns, None)
        else:
            root = Span(self, "InferRequest", parent[0], parent[1], True, start_ns, None)
        return root, SpanTrace(self, root.trace, root.span_id, self.next_id(), 0)

    def flush_soon(self) -> None:
        """Post what is recorded now, without waiting (hub: a trace settings change)."""
        self.thread.kick()

    def shutdown(self) -> None:
        """Post what is recorded and stop the thread and the exporter (blocks: call it in a worker thread)."""
        self.thread.close()
        self._exporter.shutdown()

    def families(self) -> list[dict[str, Any]]:
        """The spans this worker lost, as a counter family in the custom families' shape
        (host/metrics_snapshot.py): dropped when the queue was full, or in a post that failed."""
        return [{"name": DROPPED_FAMILY, "kind": "counter",
                 "description": "Number of OpenTelemetry spans not exported, by reason",
                 "series": [{"labels": {"reason": "queue_full"}, "value": self.thread.dropped},
                            {"labels": {"reason": "export_failed"}, "value": self.failed}]}]

    # -- the batch thread ------------------------------------------------------------------------------
    def _export(self, records: list[tuple[Any, ...]]) -> None:
        """The batch thread: the records' spans encoded, posted ``bsp_max_export_batch_size`` at a time."""
        span, batch, spans = self._encoder.span, self._batch, []
        for record in records:
            if record[0] == _RUN:
                self._run_spans(record, spans)
            else:
                spans.append(span(*record[1:]))
        for i in range(0, len(spans), batch):
            part = spans[i:i + batch]
            try:
                posted = self._post(self._encoder.request(part))
            except Exception:  # a post that raises costs its spans, never the thread
                log.exception("OpenTelemetry: posting %d spans failed", len(part))
                posted = False
            if not posted:  # the exporter logged why
                self.failed += len(part)

    def _run_spans(self, record: tuple[Any, ...], into: list[bytes]) -> None:
        """A model's span and its compute span, from the seven stage stamps (:meth:`SpanTrace.record`)."""
        _, trace_id, parent, remote, span_id, compute_id, attributes, stamps = record
        model_events: list[tuple[str, int]] = []
        compute_events: list[tuple[str, int]] = []
        compute_start = compute_end = None
        for name, ns in stamps:
            if name == "COMPUTE_START":
                compute_start = ns
            (model_events if name in _MODEL_EVENTS or compute_start is None else compute_events).append((name, ns))
            if name == "COMPUTE_END":
                compute_end = ns
        span = self._encoder.span
        if compute_start is not None and compute_end is not None:
            into.append(span("compute", trace_id, compute_id, span_id, False, compute_start, compute_end, None,
                             compute_events))
        into.append(span(attributes["triton.model_name"], trace_id, span_id, parent, remote, stamps[0][1],
                         stamps[-1][1], attributes, model_events))


def _spans_in(record: tuple[Any, ...]) -> int:
    """How many spans a record becomes (the drop count is in spans)."""
    return 2 if record[0] == _RUN else 1


def _poster(exporter: Any) -> Callable[[bytes], bool]:
    """How to post encoded bytes through ``exporter``: True when the collector took them. The SDK's exporter
    takes only its span objects in public; its HTTP client (newer releases, with retries) or its ``_export``
    (older ones) takes bytes, and either does the compression, headers and TLS the OTEL_EXPORTER_OTLP_* settings ask for."""
    client = getattr(exporter, "_client", None)
    if client is not None and hasattr(client, "export"):
        return lambda data: bool(client.export(data).success)
    if hasattr(exporter, "_export"):
        return lambda data: bool(exporter._export(data).ok)  # a requests.Response
    raise ImportError("this opentelemetry-exporter-otlp-proto-http has no way to post encoded spans")


class Span:
    """A span still open on the hub (a request's ``InferRequest`` span, an ensemble's model span): its
    events as (name, perf_counter ns); :meth:`end` hands it to the batch thread."""

    __slots__ = ("export", "name", "trace", "span_id", "parent", "remote", "start", "attributes", "events")

    def __init__(self, export: OtelExport, name: str, trace: int, parent: int, remote: bool, start: int,
                 attributes: dict[str, Any] | None) -> None:
        self.export, self.name, self.trace, self.parent, self.remote = export, name, trace, parent, remote
        self.span_id = _span_id()
        self.start, self.attributes = start, attributes
        self.events: list[tuple[str, int]] = []

    def end(self, end_ns: int) -> None:
        self.export.put((_SPAN, self.name, self.trace, self.span_id, self.parent, self.remote, self.start, end_ns,
                         self.attributes, self.events))


class SpanTrace:
    """What a traced request carries: the span its model span is a child of (``trace``: the W3C trace
    id; ``parent``: its span id; ``remote``: the client's), and Triton's trace ids. ``compute_id``: its
    compute span's id, drawn early for the BLS calls made in that compute (0: none)."""

    __slots__ = ("export", "trace", "parent", "remote", "trace_id", "parent_id", "compute_id")

    def __init__(self, export: OtelExport, trace: int, parent: int, trace_id: int, parent_id: int,
                 remote: bool = False) -> None:
        self.export, self.trace, self.parent, self.remote = export, trace, parent, remote
        self.trace_id, self.parent_id = trace_id, parent_id
        self.compute_id = 0

    def _attributes(self, model: str, version: int, request_id: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {"triton.model_name": model, "triton.model_version": version,
                                 "triton.trace_id": self.trace_id, "triton.trace_parent_id": self.parent_id}
        if request_id:
            attrs["triton.request_id"] = request_id
        return attrs

    def record(self, model: str, version: int, request_id: str, stamps: list[tuple[str, int]]) -> None:
        """A request that ran on ``model``: its model span and compute span from the seven stage stamps
        (built by the batch thread; the hub draws their ids)."""
        if not self.compute_id:  # kept: a decoupled model's BLS calls after execute returned name it too
            self.compute_id = _span_id()
        self.export.put((_RUN, self.trace, self.parent, self.remote, _span_id(), self.compute_id,
                         self._attributes(model, version, request_id), stamps))

    def open(self, model: str, version: int, request_id: str, start_ns: int) -> tuple[Span, SpanTrace]:
        """An ensemble's model span, started at ``start_ns``, and the trace whose :meth:`spawn` gives
        each step the ensemble span as parent (Triton's child traces: a new trace id each)."""
        span = Span(self.export, model, self.trace, self.parent, self.remote, start_ns,
                    self._attributes(model, version, request_id))
        span.events += (("REQUEST_START", start_ns), ("QUEUE_START", start_ns))
        return span, SpanTrace(self.export, self.trace, span.span_id, self.trace_id, self.parent_id)

    def spawn(self) -> SpanTrace:
        return SpanTrace(self.export, self.trace, self.parent, self.export.next_id(), self.trace_id, self.remote)

    def bls_child(self) -> SpanTrace:
        """The trace of a BLS request this request's model makes (hub): a child trace whose model span
        is a child of this request's compute span, as Triton parents a child trace's request span on
        the top of its parent's span stack (``tracer.cc``: the compute span while the model runs)."""
        if not self.compute_id:
            self.compute_id = _span_id()
        return SpanTrace(self.export, self.trace, self.compute_id, self.export.next_id(), self.trace_id)

    def close(self, span: Span, events: tuple[str, ...] = ("REQUEST_END",)) -> None:
        """End ``span`` now, after ``events`` stamped now (an ensemble's REQUEST_END; none for the root)."""
        now = time.perf_counter_ns()
        span.events += [(name, now) for name in events]
        span.end(now)

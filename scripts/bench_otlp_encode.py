#!/usr/bin/env python3
"""What encoding OpenTelemetry spans costs the export thread, three ways, for the same records: the SDK's
``ReadableSpan`` objects and the SDK's OTLP encoder (what the export thread did before), opentelemetry-proto's
message classes filled from the records, and ``protocol/otlp.py``'s bytes written by hand (what it does now).

The records are what the hub records for a traced add_sub request over HTTP (observability/otel.py): an
``InferRequest`` span with five events, a model span with five attributes and three events, a compute span
with four events. Reported: the thread's CPU per request, best of ``--rounds`` encodings of ``--requests``.

    PYTHONPATH=. .venv/bin/python scripts/bench_otlp_encode.py --requests 512 --rounds 5
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from triton_actor.protocol.otlp import TraceEncoder

ROOT_EVENTS = ("HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END")
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
Span = tuple[str, int, int, int, bool, int, int, "dict[str, Any] | None", "list[tuple[str, int]]"]


def records(n: int) -> list[Span]:
    """Three spans per request, as the export thread unpacks them (name, ids, parent, stamps, ...)."""
    out: list[Span] = []
    t = time.perf_counter_ns()
    for i in range(n):
        trace_id, root, model, compute = (1 << 100) + i, 10 * i + 1, 10 * i + 2, 10 * i + 3
        attrs = {"triton.model_name": "add_sub", "triton.model_version": 1, "triton.trace_id": i + 1,
                 "triton.trace_parent_id": 0}
        out += [("compute", trace_id, compute, model, False, t + 30, t + 60, None,
                 [(e, t + 30 + 10 * k) for k, e in enumerate(COMPUTE_EVENTS)]),
                ("add_sub", trace_id, model, root, False, t + 10, t + 80, attrs,
                 [(e, t + 10 + 35 * k) for k, e in enumerate(MODEL_EVENTS)]),
                ("InferRequest", trace_id, root, 0, False, t, t + 100, None,
                 [(e, t + 20 * k) for k, e in enumerate(ROOT_EVENTS)])]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    spans = records(args.requests)
    offset = time.time_ns() - time.perf_counter_ns()
    resource = Resource.create({"service.name": "triton-inference-server"})
    scope, sampled, server = InstrumentationScope("triton-server"), trace.TraceFlags(1), trace.SpanKind.SERVER

    def sdk() -> bytes:
        ctx = trace.SpanContext
        return encode_spans([ReadableSpan(
            n, context=ctx(tid, sid, False, sampled), parent=ctx(tid, p, r, sampled) if p else None,
            resource=resource, attributes=a or {}, events=tuple(Event(e, {}, ns + offset) for e, ns in ev),
            kind=server, instrumentation_scope=scope, start_time=s + offset, end_time=e_ + offset)
            for n, tid, sid, p, r, s, e_, a, ev in spans]).SerializePartialToString()

    def classes() -> bytes:
        pb_span, pb_event, kv, any_value = trace_pb2.Span, trace_pb2.Span.Event, common_pb2.KeyValue, common_pb2.AnyValue

        def value(v: Any) -> Any:
            return any_value(string_value=v) if isinstance(v, str) else any_value(int_value=v)
        out = [pb_span(trace_id=tid.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"),
                       parent_span_id=p.to_bytes(8, "big") if p else b"", name=n, kind=2,
                       start_time_unix_nano=s + offset, end_time_unix_nano=e_ + offset,
                       attributes=[kv(key=k, value=value(v)) for k, v in a.items()] if a else None,
                       events=[pb_event(time_unix_nano=ns + offset, name=e) for e, ns in ev],
                       status=trace_pb2.Status(), flags=0x300 if r else 0x100)
               for n, tid, sid, p, r, s, e_, a, ev in spans]
        attrs = [kv(key=k, value=value(v)) for k, v in resource.attributes.items()]
        return ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
            resource={"attributes": attrs}, scope_spans=[trace_pb2.ScopeSpans(
                scope=common_pb2.InstrumentationScope(name="triton-server"), spans=out)])]).SerializeToString()

    encoder = TraceEncoder(dict(resource.attributes), "triton-server", offset)

    def ours() -> bytes:
        return encoder.request([encoder.span(*s) for s in spans])

    expected = ExportTraceServiceRequest.FromString(sdk())
    for way in (sdk, classes, ours):
        assert ExportTraceServiceRequest.FromString(way()) == expected, way.__name__  # the same spans
        best = min(_cpu(way) for _ in range(args.rounds))
        print(f"[bench] {way.__name__:8} {best / 1e3 / args.requests:7.1f} µs of CPU per request "
              f"({args.requests} requests, best of {args.rounds})", flush=True)
    return 0


def _cpu(way: Any) -> int:
    start = time.thread_time_ns()
    way()
    return time.thread_time_ns() - start


if __name__ == "__main__":
    raise SystemExit(main())

"""protocol/otlp.py writes ``ExportTraceServiceRequest`` bytes by hand: checked against the OpenTelemetry SDK's
own encoder for the same spans (decoded by opentelemetry-proto's classes and compared whole), and against
the protobuf runtime for the values a hand-written encoder gets wrong first (negative ints, long fields)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from triton_actor.protocol.otlp import TraceEncoder, any_value, varint

pytestmark = pytest.mark.timeout(30)

OFFSET = 1_700_000_000_000_000_000
RESOURCE = {"service.name": "triton-inference-server", "deployment": "ci", "replicas": 3, "canary": True,
            "ratio": 0.5, "zones": ("a", "b")}
# (name, trace id, span id, parent, remote parent, start, end, attributes, events): a root with the client's
# parent, a model span with every attribute kind Triton sets, a compute span, a root of a trace of its own
SPANS: list[tuple[Any, ...]] = [
    ("InferRequest", 0xABCDEF << 64 | 5, 0x1122334455667788, 0x99, True, 10, 9000, None,
     [("HTTP_RECV_START", 1), ("HTTP_RECV_END", 5), ("HTTP_SEND_END", 9000)]),
    ("a-model-with-a-long-name-" + "x" * 200, 7, 2, 0x1122334455667788, False, 20, 800,
     {"triton.model_name": "m", "triton.model_version": 1, "triton.trace_id": 10**12 + 7,
      "triton.trace_parent_id": 0, "triton.request_id": "r-" + "é" * 100},
     [("REQUEST_START", 20), ("QUEUE_START", 30), ("REQUEST_END", 800)]),
    ("compute", 7, 3, 2, False, 40, 700, None,
     [("COMPUTE_START", 40), ("COMPUTE_INPUT_END", 50), ("COMPUTE_OUTPUT_START", 600), ("COMPUTE_END", 700)]),
    ("InferRequest", (1 << 128) - 1, (1 << 64) - 1, 0, False, 0, 0, {}, []),
]


def _sdk_span(resource: Resource, name: str, trace_id: int, span_id: int, parent: int, remote: bool, start: int,
              end: int, attributes: dict[str, Any] | None, events: list[tuple[str, int]]) -> ReadableSpan:
    sampled = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    return ReadableSpan(
        name, context=trace.SpanContext(trace_id, span_id, False, sampled),
        parent=trace.SpanContext(trace_id, parent, remote, sampled) if parent else None, resource=resource,
        attributes=attributes or {}, events=tuple(Event(n, {}, ns + OFFSET) for n, ns in events),
        kind=trace.SpanKind.SERVER, instrumentation_scope=InstrumentationScope("triton-server"),
        start_time=start + OFFSET, end_time=end + OFFSET)


def test_the_request_is_the_one_the_sdks_encoder_makes() -> None:
    resource = Resource(RESOURCE)
    expected = encode_spans([_sdk_span(resource, *s) for s in SPANS])
    encoder = TraceEncoder(RESOURCE, "triton-server", OFFSET)
    for _ in range(2):  # the second time from the encoder's caches of names and keys
        ours = encoder.request([encoder.span(*s) for s in SPANS])
        assert ExportTraceServiceRequest.FromString(ours) == expected
        assert ours == expected.SerializeToString()  # the same field order too


def test_values_and_varints_as_protobuf_writes_them() -> None:
    for value, field in ((-1, "int_value"), (-(2**63), "int_value"), (2**63 - 1, "int_value"), (0, "int_value"),
                         (False, "bool_value"), (-0.25, "double_value"), ("", "string_value")):
        assert any_value(value) == AnyValue(**{field: value}).SerializeToString(), value
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**64 - 1):
        assert varint(n) == AnyValue(int_value=n if n < 2**63 else n - 2**64).SerializeToString()[1:], n

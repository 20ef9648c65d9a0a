"""OTLP traces as protobuf bytes (``ExportTraceServiceRequest``, opentelemetry-proto's
``collector/trace/v1/trace_service.proto`` and ``trace/v1/trace.proto``): sans-I/O, written field by field.

Why by hand: the OpenTelemetry export thread (observability/otel.py) holds the GIL while it encodes, and
every microsecond of it is taken from the hub. Building the SDK's ``ReadableSpan`` objects and running the
SDK's encoder cost 143-152 µs per traced request (three spans, twelve events); the protobuf message
classes of opentelemetry-proto, filled from the same records, 51-52 µs; writing the bytes here, with the
constant pieces (event names, attribute keys, the resource and scope) encoded once, 13.5 µs
(scripts/bench_otlp_encode.py; docs/performance.md, "OpenTelemetry spans encoded from the records").

What is written is what the SDK's encoder writes for the same span (tests/unit/protocol/test_otlp_encoding.py
decodes both and compares): ``trace_id``, ``span_id``, ``parent_span_id`` (absent for a root), ``name``,
``kind``, the two times, the attributes, the events (time and name, no attributes), an empty ``status``
and ``flags`` (``HAS_IS_REMOTE``, with ``IS_REMOTE`` when the parent came from the client). Attribute values:
str, bool, int, float, and lists or tuples of those (an ``ArrayValue``); anything else as its ``str()``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

_Q = struct.Struct("<Q").pack  # fixed64
_D = struct.Struct("<d").pack  # double
_MASK64 = (1 << 64) - 1
_FLAGS = (b"\x85\x01\x00\x01\x00\x00", b"\x85\x01\x00\x03\x00\x00")  # field 16 fixed32: 0x100, 0x300
_STATUS = b"\x7a\x00"  # field 15: an empty Status (code UNSET), as the SDK writes it
_KIND_SERVER = 2


def varint(n: int) -> bytes:
    """``n`` (0 <= n < 2**64) as a protobuf varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte (field number < 16), length and bytes."""
    return bytes((tag,)) + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """An ``AnyValue`` message's bytes."""
    if value.__class__ is str:
        return _field(0x0A, value.encode())
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + varint(value & _MASK64)  # int64: two's complement, ten bytes when negative
    if isinstance(value, float):
        return b"\x21" + _D(value)
    if isinstance(value, (list, tuple)):
        return _field(0x2A, b"".join(_field(0x0A, any_value(v)) for v in value))  # ArrayValue.values
    return _field(0x0A, str(value).encode())


def key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message's bytes."""
    return _field(0x0A, key.encode()) + _field(0x12, any_value(value))


class TraceEncoder:
    """One server's spans as ``ExportTraceServiceRequest`` bytes: one resource, one instrumentation scope.

    :meth:`span` writes one span (a ``ScopeSpans.spans`` entry, field tag included); :meth:`request` wraps
    the spans written into the request to post. Times are given on a clock ``offset`` ns behind the Unix
    epoch's (the recorder's ``perf_counter_ns``), so the caller passes its stamps as they were taken."""

    def __init__(self, resource: Mapping[str, Any], scope: str, offset: int) -> None:
        self.offset = offset
        resource_bytes = b"".join(_field(0x0A, key_value(k, v)) for k, v in resource.items())
        self._head = _field(0x0A, resource_bytes)  # ResourceSpans.resource
        self._scope = _field(0x0A, _field(0x0A, scope.encode()))  # ScopeSpans.scope (name only)
        self._names: dict[str, bytes] = {}  # a span name: its field 5 and kind
        self._events: dict[str, tuple[bytes, bytes]] = {}  # an event name: (before its time, after it)
        self._keys: dict[str, bytes] = {}  # an attribute key: its KeyValue's field 1

    def _event(self, name: str) -> tuple[bytes, bytes]:
        tail = _field(0x12, name.encode())  # Event.name
        parts = self._events[name] = (b"\x5a" + varint(9 + len(tail)) + b"\x09", tail)  # Span.events: time first
        return parts

    def _name(self, name: str) -> bytes:
        parts = self._names[name] = _field(0x2A, name.encode()) + bytes((0x30, _KIND_SERVER))
        return parts

    def _attributes(self, attributes: Mapping[str, Any]) -> bytes:
        keys, out = self._keys, []
        for key, value in attributes.items():
            head = keys.get(key)
            if head is None:
                head = keys[key] = _field(0x0A, key.encode())
            if value.__class__ is int and 0 <= value < 0x80:
                kv = head + b"\x12\x02\x18" + bytes((value,))
            else:
                kv = head + _field(0x12, any_value(value))
            out.append(b"\x4a" + varint(len(kv)) + kv)  # Span.attributes
        return b"".join(out)

    def span(self, name: str, trace_id: int, span_id: int, parent: int, remote: bool, start: int, end: int,
             attributes: Mapping[str, Any] | None, events: Iterable[tuple[str, int]]) -> bytes:
        """One span's ``ScopeSpans.spans`` field; ``parent`` 0: a root; ``remote``: the parent is the client's."""
        offset = self.offset
        parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
        if parent:
            parts += (b"\x22\x08", parent.to_bytes(8, "big"))
        parts += (self._names.get(name) or self._name(name), b"\x39", _Q(start + offset), b"\x41", _Q(end + offset))
        if attributes:
            parts.append(self._attributes(attributes))
        names = self._events
        for event, ns in events:
            head, tail = names.get(event) or self._event(event)
            parts += (head, _Q(ns + offset), tail)
        parts += (_STATUS, _FLAGS[remote])
        body = b"".join(parts)
        return b"\x12" + varint(len(body)) + body

    def request(self, spans: list[bytes]) -> bytes:
        """The ``ExportTraceServiceRequest`` that carries ``spans`` (each from :meth:`span`)."""
        scope_spans = self._scope + b"".join(spans)
        resource_spans = self._head + b"\x12" + varint(len(scope_spans)) + scope_spans
        return b"\x0a" + varint(len(resource_spans)) + resource_spans

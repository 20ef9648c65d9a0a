"""The gRPC method table and statuses: which servicer method a ``:path`` names (:func:`method_table`,
:func:`route`), the gRPC status codes on the wire and :data:`GRPC_STATUS`, the one map from our error
codes to them, :class:`Refused`, a call's end with a status before it reaches the servicer, and the
encoded response heads and OK trailers; and the seams between a call and its connection
(:class:`CallServer`, :class:`CallConnection`: what a call needs of them, which :mod:`.grpc_h2` provides).

:mod:`.grpc_calls` runs the calls; :mod:`.grpc_h2` routes each new stream here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gevent

from ..errors import Code
from ..protocol import codings, v2_grpc_plan
from ..protocol import http2 as h2
from ..protocol._generated import grpc_service_pb2 as pb
from ..protocol._generated import health_pb2
from ..protocol.h2_connection import H2Connection
from ..protocol.h2_events import H2Stream
from .budget import ByteBudget
from .grpc import GrpcServicer

# grpc status codes (numbers are the wire values)
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS = 0, 1, 2, 3, 4, 5, 6
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14
GRPC_STATUS: dict[Code, int] = {
    Code.INTERNAL: INTERNAL, Code.NOT_FOUND: NOT_FOUND, Code.UNAVAILABLE: UNAVAILABLE,
    Code.UNSUPPORTED: UNIMPLEMENTED, Code.INVALID_ARG: INVALID_ARGUMENT, Code.UNKNOWN: UNKNOWN,
    Code.ALREADY_EXISTS: ALREADY_EXISTS, Code.CANCELLED: CANCELLED,
}

RESPONSE_HEAD = h2.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                   (b"grpc-accept-encoding", b"identity,deflate,gzip")])
OK_TRAILERS = h2.encode_headers([(b"grpc-status", b"0")])
CODED_HEADS = {coding: h2.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                          (b"grpc-encoding", coding.encode()),
                                          (b"grpc-accept-encoding", b"identity,deflate,gzip")])
               for coding in codings.CODINGS}


class CallServer(Protocol):
    """What a call reads of the server its connection belongs to (``grpc_h2.GrpcH2Server``)."""

    budget: ByteBudget  # request bytes held by all calls
    max_receive: int  # bytes of one request message
    max_send: int  # bytes of one response message


class CallConnection(Protocol):
    """What a call needs of its connection (``grpc_h2.Connection``; the driver hands each stream's events to
    the calls, so the calls know the connection by this seam only). Every method runs in a hub greenlet."""

    server: CallServer
    h2: H2Connection  # the connection's state machine
    writer: gevent.Greenlet | None  # the greenlet inside sendall, if any

    def flush(self) -> bool: ...

    def wait_window(self, stream: H2Stream) -> int: ...

    def call_finished(self) -> None: ...


class Refused(Exception):
    """A call ends with a gRPC status before (or instead of) reaching the servicer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: ``parse`` its request message, ``call`` the servicer with it. A method that can be run
    in two steps (ModelInfer) also has ``start`` (decode and queue: ``(request, pending)``) and ``finish``
    (wait, encode and serialize: the answer's bytes): the connection's reader starts it and answers at once when the model already has."""

    parse: Callable[[bytes], Any]
    call: Callable[..., Any]
    streaming: bool
    start: Callable[..., tuple[Any, Any]] | None = None
    finish: Callable[[Any, Any], Any] | None = None
    # ModelInfer's message (framed, uncompressed) → (its answer's bytes when the response cache answered the
    # same bytes before, else None; what ``learn(kept, request, pending)`` remembers them by, or None): a
    # fast path; None on a server without a response cache
    again: Callable[[bytes | bytearray], tuple[bytes | None, Any]] | None = None
    learn: Callable[[Any, Any, Any], None] = lambda _kept, _request, _pending: None
    # ModelInfer: a request message that comes whole in one DATA frame skips the buffer
    # (``grpc_calls.Call.on_data``, a fast path)
    whole: bool = False

    @property
    def infer(self) -> bool:
        """ModelInfer (the one unary method run in two steps): it carries a request for a model."""
        return self.start is not None


def method_table(servicer: GrpcServicer) -> dict[bytes, Method]:
    """``:path`` → method, for ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health/Check``."""
    methods = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_type = getattr(pb, method.input_type.name)
        streaming = method.name == "ModelStreamInfer"
        call = servicer.stream_infer if streaming else getattr(servicer, method.name)
        path = f"/inference.GRPCInferenceService/{method.name}".encode()
        if method.name == "ModelInfer":
            # the message's bytes through a decode plan when they repeat (a fast path; slow: FromString)
            methods[path] = Method(v2_grpc_plan.parse_infer, call, False, servicer.start_infer,
                                   servicer.finish_infer_wire, *((servicer.again_infer, servicer.learn_infer)
                                                                 if servicer.caching else ()),
                                   whole=True)
        else:  # (a servicer's own parse: a method whose message must not be held while it runs)
            methods[path] = Method(servicer.parsers.get(method.name, request_type.FromString), call, streaming)
    methods[b"/grpc.health.v1.Health/Check"] = Method(health_pb2.HealthCheckRequest.FromString, servicer.Check, False)
    return methods


def route(methods: dict[bytes, Method], headers: h2.HeaderBlock) -> tuple[Method | None, bytes | None, bool]:
    """(method, grpc-encoding, is a gRPC request) of a header block, kept on the (cached) block."""
    found = headers.route
    if found is None:
        is_grpc = headers.get(b":method") == b"POST" and \
            headers.get(b"content-type", b"").startswith(b"application/grpc")
        found = headers.route = (methods.get(headers.get(b":path", b"")), headers.get(b"grpc-encoding"), is_grpc)
    return found

"""``--grpc-server grpcio``: grpcio's sync server on native threads, each call handed to a hub greenlet.

Not the default any more: :mod:`.grpc_h2` (our own HTTP/2 in hub greenlets) replaced it after it
measured 1.45x / 1.56x Triton's rate at concurrency 1 / 4 where this server reached 0.44x / 0.40x
(``scripts/bench_grpc.py --variants builtin,grpcio``). It stays as the fallback for anything the
builtin transport lacks, and the measurements below are why grpcio itself could not get there.

How the design was chosen: ``scripts/bench_grpc.py --variants native,aio,gevent --rounds 3
--window-ms 2000`` ran perf_analyzer ``-i grpc`` on add_sub against the three candidates and real
Triton 2.51, interleaved, on the shared 2-core VM (load average 6-7: compare ratios within the run),
medians (infer/s, p50):

=====================================  ====================  ====================
candidate                              concurrency 1         concurrency 4
=====================================  ====================  ====================
native: this module                    1433, 661 us (0.76x)  1485, 2537 us (0.67x)
aio: grpc.aio loop in a native thread  1230, 759 us (0.65x)  1611, 2271 us (0.73x)
gevent: ``init_gevent()`` (documented) 1423, 665 us (0.75x)  1062, 3552 us (0.48x)
real Triton 2.51                       1885, 508 us          2208, 1746 us
=====================================  ====================  ====================

The documented integration serialises grpc's completion-queue work on the hub and falls behind
under concurrency (as in feasibility §7); skipping ``init_gevent`` while grpcio's threads are
patched into greenlets hangs. The native and aio designs keep grpcio off the hub and are level
within the noise; native won because it is the simpler one to keep correct: it serves the
streaming RPC with the same threads, needs no second event loop, and leaves grpcio's own
machinery as it is (``scripts/grpc_candidates.py`` keeps the losers runnable). A fourth candidate,
``hub`` (grpcio's handlers themselves in hub greenlets, blocking the hub while grpcio waits on its
polling thread), measured level with native in a later run (c=1 0.66x vs 0.78x, c=4 0.39x vs
0.38x) and blocks the hub, so it lost too. A clean run of the shipped design (bench_grpc.py
--variants native, load ~4): gRPC c=1 1332/s p50 691 us (0.62x), c=4 1644/s p50 2307 us (0.42x);
HTTP in the same run 1.09x and 0.88x.

How it works: grpcio's polling thread and handler threads are *native* OS threads
(``grpc._server`` is given the unpatched ``threading`` of :mod:`..actors.native_threads`, and the
handler pool is a :class:`NativeExecutor`); only the servicer method crosses to the hub, through a
:class:`HubPort` (one hop there, one back). ``init_gevent`` is never called, so grpc's C core does
its own I/O.

Where the time goes (sequential Python client, add_sub, p50): grpcio's sync server answering a canned
response from its handler thread ~450-490 us; handing that canned answer through the hub adds
~70-140 us; the real servicer (decode, data plane, inline model, encode) another ~170-190 us. So
grpcio's own per-call cost (a handler thread woken per call, a round trip to the polling thread to
read the request) is most of the gap to Triton, and under concurrency the one process's GIL is the
limit (~540 us of CPU per gRPC request against ~205 us per HTTP request). A ratio of 1.0 needs a
cheaper gRPC stack than grpcio's Python server (or gRPC served from more than one process).

Status codes are mapped here and only here (spec §1.2).
"""

from __future__ import annotations

import _queue
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc._server as grpc_server_module
from google.protobuf.message import DecodeError

from ..actors.hub_port import HubPort
from ..actors.native_threads import NativeExecutor, native_threading
from ..errors import Code, TritonError
from ..protocol._generated import grpc_service_pb2 as pb
from ..protocol._generated import health_pb2
from .grpc import GrpcServicer

log = logging.getLogger(__name__)

GRPC_STATUS: dict[Code, grpc.StatusCode] = {
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}
MAX_MESSAGE = 2**31 - 1  # Triton sets INT32_MAX for both directions (spec §2.1)
_SERVICE = "inference.GRPCInferenceService"
_HEALTH = "grpc.health.v1.Health"
_END = object()  # the client closed its side of a stream
_GONE = object()  # the stream's RPC is over (cancelled, or the server stops)


class _Malformed:
    """What a request deserializer returns for bytes that are not the message. Triton answers
    INTERNAL "Unable to parse request" (checked against 2.51), and the server goes on serving."""

    error = TritonError.internal("Unable to parse request")


_MALFORMED = _Malformed()


def _deserializer(message_type: Any) -> Callable[[bytes], Any]:
    parse = message_type.FromString

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return _MALFORMED

    return deserialize


def _abort(context: grpc.ServicerContext, error: TritonError) -> None:
    context.abort(GRPC_STATUS[error.code], error.message)


class GrpcServer:
    """grpcio's server with our handlers; create, ``start`` and ``stop`` it from the hub thread."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, options: dict[str, Any] | None = None) -> None:
        self.servicer = servicer
        self.address = address
        self.port = port
        self._port = HubPort()
        self._executor, self._call = self._runtime()
        opts = {"grpc.max_send_message_length": MAX_MESSAGE, "grpc.max_receive_message_length": MAX_MESSAGE,
                "grpc.so_reuseport": 0, **(options or {})}
        self._server = grpc.server(self._executor, options=list(opts.items()))  # type: ignore[arg-type]
        self._server.add_registered_method_handlers(_SERVICE, self._handlers())
        self._server.add_registered_method_handlers(_HEALTH, {
            "Check": grpc.unary_unary_rpc_method_handler(
                self._unary(servicer.Check), request_deserializer=_deserializer(health_pb2.HealthCheckRequest),
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        })
        self.server_port = 0

    def _runtime(self) -> tuple[Any, Callable[..., Any]]:
        """grpcio's handler pool and how a handler runs a servicer method: native threads, via the hub port."""
        grpc_server_module.threading = native_threading()  # grpcio's server threads and locks: native
        return NativeExecutor("grpc"), self._port.call

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            request_type = getattr(pb, method.input_type.name)
            response_type = getattr(pb, method.output_type.name)
            if method.name == "ModelStreamInfer":
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self._stream, request_deserializer=_deserializer(request_type),
                    response_serializer=response_type.SerializeToString)
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._unary(getattr(self.servicer, method.name)),
                    request_deserializer=_deserializer(request_type),
                    response_serializer=response_type.SerializeToString)
        return handlers

    # -- native threads (grpcio's handler pool) ----------------------------------------------------
    def _unary(self, method: Callable[[Any], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
        call = self._call

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            if request is _MALFORMED:
                _abort(context, _Malformed.error)
            try:
                return call(self._guarded, method, request)
            except TritonError as e:
                _abort(context, e)

        return handle

    def _stream(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """``ModelStreamInfer``: a reader thread hands each request to the hub; this generator writes
        the responses as they complete, until the client has closed its side and all are written."""
        out: _queue.SimpleQueue = _queue.SimpleQueue()
        gone: list[bool] = []  # non-empty once the client went away; the hub side stops its requests then

        def cancelled() -> None:
            gone.append(True)
            out.put(_GONE)  # a cancelled RPC must not leave this thread waiting

        context.add_callback(cancelled)
        self._executor.submit(self._read_stream, requests, out, gone)
        pending, reading = 0, True
        while reading or pending:
            item = out.get()
            if item is _GONE:
                return
            if item is _END:
                reading = False
            elif item.__class__ is int:
                pending += item  # +1: a request was handed over, -1: all its responses were written
            else:
                yield item

    def _read_stream(self, requests: Iterator[Any], out: _queue.SimpleQueue, gone: list[bool]) -> None:
        try:
            for request in requests:
                out.put(1)
                if request is _MALFORMED:
                    out.put(pb.ModelStreamInferResponse(error_message=_Malformed.error.message))
                    out.put(-1)
                else:
                    self._port.post(self._stream_one, request, out, gone)
        except grpc.RpcError:
            pass  # the client went away: the generator's RPC is over too
        except Exception:
            log.exception("reading a ModelStreamInfer stream failed")
        finally:
            out.put(_END)

    # -- hub greenlets --------------------------------------------------------------------------
    def _guarded(self, method: Callable[[Any], Any], request: Any) -> Any:
        try:
            return method(request)
        except TritonError:
            raise
        except Exception as e:
            log.exception("unexpected error in gRPC %s", getattr(method, "__name__", method))
            raise TritonError.internal(f"internal error: {e!r}") from None

    def _stream_one(self, request: Any, out: _queue.SimpleQueue, gone: list[bool]) -> None:
        """Hub greenlet: the responses of one request on a stream; once the client has gone, closing
        the generator cancels the request (a decoupled model sees ``is_cancelled()``)."""
        responses = self.servicer.stream_infer(request)
        try:
            for response in responses:
                if gone:
                    break
                out.put(response)
        finally:
            responses.close()
            out.put(-1)

    # -- lifecycle (hub thread) -----------------------------------------------------------------
    def start(self) -> int:
        """Bind and start serving; returns the bound port (``port`` 0 picks a free one)."""
        try:
            self.server_port = self._server.add_insecure_port(f"{self.address}:{self.port}")
        except RuntimeError as e:
            raise OSError(f"failed to bind gRPC to {self.address}:{self.port}: {e}") from None
        self._server.start()
        return self.server_port

    def stop(self, grace: float) -> None:
        """Refuse new RPCs, give running ones ``grace`` seconds, then cancel them."""
        done = self._server.stop(grace)
        # grpcio's event is a native one: wait for it off the hub so greenlets (the RPCs) can finish
        from ..actors.bridge import call_in_thread

        call_in_thread(done.wait, grace + 5)
        self._executor.shutdown()
        self._port.close()

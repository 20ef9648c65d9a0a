"""gRPC front end: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` (https://github.com/triton-inference-server/common/blob/main/protobuf/grpc_service.proto).

Every method here runs in a hub greenlet (a call's, :mod:`.grpc_calls`) and is decode → data-plane
call → encode; errors are raised as ``TritonError`` and mapped to gRPC status codes by
:mod:`.grpc_calls`. Method names are the RPC names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple

import gevent
import gevent.lock

from ..errors import Code, TritonError
from ..inference import InferRequest, InferResponse
from ..plane import cache_front
from ..plane.dataplane import DataPlane, Pending
from ..plane.route import Route
from ..protocol import header_forward, v2_grpc
from ..protocol._generated import grpc_service_pb2 as pb
from ..protocol._generated import health_pb2
from ..protocol.v2_grpc_plan import Planned
from ..runtime import fastpath
from ..runtime.response_channel import StreamAccount
from . import cached_answers
from .offload import Offload

log = logging.getLogger(__name__)

_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"


class StreamError(NamedTuple):
    """An error answer on ``ModelStreamInfer``: the ``error_message`` response the stream carries by
    default, and the code that ends the stream with a gRPC status when the client asked for that
    (the ``triton_grpc_error: true`` header, Triton 24.08+)."""

    response: pb.ModelStreamInferResponse
    code: Code
    message: str


class GrpcServicer:
    """The RPCs, each ``method(request message) -> response message`` in a hub greenlet."""

    # methods whose request is decoded by a parse of their own, not ``FromString`` (grpc_methods.py): a
    # load's message held its config override (up to 4 MiB) for the whole load (issue 23)
    parsers: ClassVar[dict[str, Callable[[bytes], Any]]] = {"RepositoryModelLoad": v2_grpc.decode_load_request}

    def __init__(self, plane: DataPlane, offload: Offload | None = None, caching: bool = True) -> None:
        self.plane = plane
        self.settings = plane.runtime
        self.offload = offload or Offload()  # big decodes off the hub, by the rule HTTP follows too
        # the server has a response cache (--cache-config): only then is a ModelInfer's message looked up by
        # its bytes (again_infer); without one the scan was a tenth of a gRPC request's bytecodes (443 of 5396)
        self.caching = caching

    # -- health and metadata ----------------------------------------------------------------------
    def ServerLive(self, req: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.is_live())

    def ServerReady(self, req: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.is_ready())

    def ModelReady(self, req: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        try:
            ready = self.plane.model_ready(req.name, v2_grpc.parse_version(req.version))
        except TritonError:
            ready = False  # Triton answers OK with ready=false for unknown models and versions too
        return pb.ModelReadyResponse(ready=ready)

    def ServerMetadata(self, req: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return v2_grpc.from_dict(pb.ServerMetadataResponse, self.plane.server_metadata())

    def ModelMetadata(self, req: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self.plane.model_metadata(req.name, v2_grpc.parse_version(req.version))
        return v2_grpc.from_dict(pb.ModelMetadataResponse, meta)

    def ModelConfig(self, req: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self.plane.model_config_message(req.name, v2_grpc.parse_version(req.version)))

    def ModelStatistics(self, req: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        stats = self.plane.statistics(req.name, v2_grpc.parse_version(req.version))
        return v2_grpc.from_dict(pb.ModelStatisticsResponse, stats)

    # -- inference --------------------------------------------------------------------------------
    def ModelInfer(self, req: pb.ModelInferRequest | Planned, forwarded: dict[str, str] | None = None) -> pb.ModelInferResponse:
        return self.finish_infer(*self.start_infer(req, forwarded))

    def start_infer(self, req: pb.ModelInferRequest | Planned, forwarded: dict[str, str] | None = None,
                    ) -> tuple[InferRequest, Pending]:
        """``ModelInfer`` in two steps for a transport that will not wait: decode and queue (here),
        then :meth:`finish_infer` once ``pending.reply`` is ready (it waits if it is not). ``forwarded``:
        the call's metadata that --grpc-header-forward-pattern passes on as parameters."""
        if req.__class__ is Planned:  # decoded from a plan (protocol/v2_grpc_plan.py): a fast path
            route = self.plane.route(req.model_name, req.version)
            # Triton: gRPC ModelInfer refuses decoupled models (UNIMPLEMENTED), only the stream serves them
            route.refuse_decoupled(_DECOUPLED)
            if forwarded is None:  # no metadata for the model, no trace context: the request as planned
                return req.request, cache_front.start(self.plane, req.request, route, None)
            decoded = req.request
        else:
            route = self._route(req)
            route.refuse_decoupled(_DECOUPLED)
            decoded = None
        params, traceparent = header_forward.split_trace(forwarded)
        request = header_forward.with_forwarded(self._decode(req, route) if decoded is None else decoded, params)
        return request, cache_front.start(self.plane, request, route, traceparent)

    def again_infer(self, buf: bytes | bytearray) -> tuple[bytes | None, Any]:
        """A ModelInfer message answered from the response cache before: its answer's bytes, the message
        taken out of ``buf`` when it is the call's buffer (:func:`.cached_answers.grpc_again`)."""
        return cached_answers.grpc_again(self.plane, buf)

    def learn_infer(self, kept: Any, request: InferRequest, pending: Pending) -> None:
        cached_answers.grpc_learn(kept, request, pending)

    def _route(self, req: pb.ModelInferRequest) -> Route:
        """The route of the model and version ``req`` names (an unreadable version: the decode says so)."""
        try:
            version = v2_grpc.parse_version(req.model_version) if req.model_version else -1
        except TritonError:
            version = -1
        return self.plane.route(req.model_name, version)

    def _decode(self, req: pb.ModelInferRequest, route: Route) -> InferRequest:
        """Decode ``req`` by the offload rule (frontends/offload.py): typed ``contents`` and many
        parameters are work in elements (:func:`~.v2_grpc.decode_work`); 14 M FP32 typed values took
        1.2 s to convert, 500,000 request parameters 1.2 s."""
        return self.offload.run(v2_grpc.decode_work(req), v2_grpc.decode_infer_request, req, self.plane.shm,
                                route.inputs)

    def finish_infer(self, request: InferRequest, pending: Pending) -> pb.ModelInferResponse:
        if pending.hit is not None:  # answered from the response cache (a fast path)
            return cached_answers.grpc_message(pending, request, self._encode)
        return self._encode(request, self._response(pending), pending.route)

    @staticmethod
    def _response(pending: Pending) -> InferResponse:
        try:
            return pending.reply.get()
        except gevent.GreenletExit:
            # the call was cancelled (RST_STREAM, a lost connection): a request still queued is
            # dropped by its scheduler instead of run (one already running finishes unseen)
            pending.reply.fail(TritonError(Code.CANCELLED, "request cancelled by the client"))
            raise

    def finish_infer_wire(self, request: InferRequest, pending: Pending) -> bytes:
        """:meth:`finish_infer`'s message serialized, what the HTTP/2 call sends: built from kept pieces
        when the response allows it (a fast path), else the message's ``SerializeToString()``."""
        if pending.hit is not None or not fastpath.enabled:
            return self.finish_infer(request, pending).SerializeToString()
        response, route = self._response(pending), pending.route
        encoding = route.encoding  # (version, labels, batching) of a route that serves: always, here
        version, labels, batching = encoding if encoding is not None else (route.version, route.labels, route.batching)
        data = v2_grpc.encode_infer_response_bytes(request, response, version, labels, batching)
        return self._encode(request, response, route).SerializeToString() if data is None else data

    def _encode(self, request: InferRequest, response: InferResponse, route: Route) -> pb.ModelInferResponse:
        return v2_grpc.encode_infer_response(request, response, route.version, route.labels, route.batching,
                                             self.plane.shm)

    def stream_infer(self, req: pb.ModelInferRequest, forwarded: dict[str, str] | None = None,
                     account: StreamAccount | None = None) -> Iterator[pb.ModelStreamInferResponse | StreamError]:
        """The responses to one request on ``ModelStreamInfer`` (any number from a decoupled model,
        one from any other), each with ``triton_final_response``; an error becomes ``error_message``
        (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/decoupled_models.md) and the stream goes on. A flags-only final is sent only when the request asked
        for it with ``triton_enable_empty_final_response``. Closing this iterator (the client went
        away) cancels the request. ``account``: the bound on undelivered responses its stream's requests
        share (runtime/response_channel.py)."""
        request = None
        try:
            route = self._route(req)
            params, traceparent = header_forward.split_trace(forwarded)
            request = header_forward.with_forwarded(self._decode(req, route), params)
            streamed = self.plane.infer_stream(request, account=account, route=route, traceparent=traceparent)
        except TritonError as e:
            yield StreamError(v2_grpc.stream_error(req, e.message), e.code, e.message)
            return
        except Exception as e:
            log.exception("unexpected error on ModelStreamInfer for '%s'", req.model_name)
            yield StreamError(v2_grpc.stream_error(req, f"internal error: {e!r}"), Code.INTERNAL, f"internal error: {e!r}")
            return
        empty_final = v2_grpc.wants_empty_final(req)
        responses = streamed.responses
        try:
            for item, final in responses:
                if isinstance(item, TritonError):
                    yield StreamError(v2_grpc.stream_error(req, item.message), item.code, item.message)
                elif item is not None:
                    try:
                        route = streamed.route
                        msg = v2_grpc.encode_infer_response(request, item, route.version, route.labels,
                                                            route.batching, self.plane.shm)
                    except TritonError as e:
                        yield StreamError(v2_grpc.stream_error(req, e.message), e.code, e.message)
                        continue
                    yield v2_grpc.stream_response(msg, final)
                elif empty_final:
                    yield v2_grpc.stream_response(v2_grpc.empty_response(request, streamed.route.version), True)
        finally:
            responses.close()

    # -- repository -------------------------------------------------------------------------------
    def RepositoryIndex(self, req: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        _no_repository_name(req.repository_name)
        return v2_grpc.repository_index(self.plane.repository_index(req.ready))

    def RepositoryModelLoad(self, req: v2_grpc.LoadRequest) -> pb.RepositoryModelLoadResponse:
        """``req``: decoded by the method table's parse (v2_grpc.decode_load_request), not the message,
        which would hold the config override's bytes for the whole load (issue 23)."""
        _no_repository_name(req.repository_name)
        self.plane.load_model(req.model_name, req.parameters)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, req: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        _no_repository_name(req.repository_name)
        params = v2_grpc.repository_parameters(req.parameters)
        self.plane.unload_model(req.model_name, bool(params.get("unload_dependents", False)))
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ----------------------------------------------------------------------------
    def SystemSharedMemoryStatus(self, req: pb.SystemSharedMemoryStatusRequest) -> pb.SystemSharedMemoryStatusResponse:
        msg = pb.SystemSharedMemoryStatusResponse()
        for region in self.plane.shm.system_status(req.name):
            msg.regions[region["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return msg

    def SystemSharedMemoryRegister(self, req: pb.SystemSharedMemoryRegisterRequest) -> Any:
        self.plane.shm.register_system(req.name, req.key, req.offset, req.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, req: pb.SystemSharedMemoryUnregisterRequest) -> Any:
        self.plane.shm.unregister_system(req.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, req: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        self.plane.shm.cuda_status(req.name)  # never any region; raises for a named one
        return pb.CudaSharedMemoryStatusResponse()

    def CudaSharedMemoryRegister(self, req: pb.CudaSharedMemoryRegisterRequest) -> Any:
        self.plane.shm.register_cuda(req.name, req.raw_handle, req.device_id, req.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, req: pb.CudaSharedMemoryUnregisterRequest) -> Any:
        self.plane.shm.unregister_cuda(req.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and logging ------------------------------------------------------------------------
    def TraceSetting(self, req: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        if req.model_name and not self.plane.is_known(req.model_name):
            raise TritonError.invalid_arg(f"Request for unknown model : {req.model_name}")
        changes = {key: list(v.value) for key, v in req.settings.items()}
        current = self.settings.update_trace(changes, req.model_name) if changes else \
            self.settings.trace_settings(req.model_name)
        msg = pb.TraceSettingResponse()
        for key, values in current.items():
            msg.settings[key].value.extend(values)
        return msg

    def LogSettings(self, req: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        changes = {key: v2_grpc.oneof_value(v) for key, v in req.settings.items()}
        current = self.settings.update_log(changes) if changes else dict(self.settings.log)
        msg = pb.LogSettingsResponse()
        for key, value in current.items():
            p = msg.settings[key]
            if isinstance(value, bool):
                p.bool_param = value
            elif isinstance(value, int):
                p.uint32_param = value
            else:
                p.string_param = value
        return msg

    # -- grpc.health.v1.Health --------------------------------------------------------------------
    def Check(self, req: health_pb2.HealthCheckRequest) -> health_pb2.HealthCheckResponse:
        """SERVING iff the server is live (Triton's health service)."""
        status = health_pb2.HealthCheckResponse.SERVING if self.plane.is_live() else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def _no_repository_name(name: str) -> None:
    if name:
        raise TritonError.unsupported("'repository_name' specification is not supported")

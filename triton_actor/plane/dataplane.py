"""The one data plane behind every front end: decode → **call** → encode, this is the call part.

Front ends (HTTP now, gRPC later) turn wire messages into these calls and the results back into wire
messages. It reads the repository actor's published routing table (no round trip on the hot path);
lifecycle calls and the index go through the typed :class:`~..actors.repository.messages.RepositoryRef`.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any

from ..actors.model.handles import READY, ModelHandle, VersionHandle
from ..actors.repository.actor import RepositoryActor
from ..errors import TritonError
from ..host import handlers as hostwide
from ..host.base import Host, LocalHost
from ..host.shared_memory import SharedMemoryRegistry
from ..inference import InferRequest, InferResponse
from ..observability.log_trace_settings import RuntimeSettings
from ..protocol import payloads
from ..protocol.dtypes import BY_ENUM_VALUE, DType
from ..repository import config as config_mod
from ..repository.overrides import FILE_PREFIX, check_config_size
from ..runtime.kernel import Reply
from ..runtime.response_channel import (
    STREAM_MAX_BYTES,
    STREAM_MAX_RESPONSES,
    STREAM_STALL_SECS,
    BoundedResponseChannel,
    ChannelResponses,
    StreamAccount,
)

SERVER_VERSION = "2.51.0"  # the Triton release whose protocol we speak (clients compare versions)


@dataclass(slots=True)
class Served:
    """A finished inference with what the encoder needs to know about the model."""

    response: InferResponse
    version: int
    labels: dict[str, list[str]]
    batching: bool


@dataclass(slots=True)
class Pending:
    """A queued inference: ``reply`` completes with the response; the rest is what the encoder needs."""

    reply: Reply[InferResponse]
    version: int
    labels: dict[str, list[str]]
    batching: bool


@dataclass(slots=True)
class Streamed:
    """A streaming inference: ``responses`` yields ``(InferResponse | TritonError | None, final)``;
    None is a final flag without a response. Closing the iterator early cancels the request (also
    before its first item): the consumer must close it when it stops before the final response."""

    version: int
    labels: dict[str, list[str]]
    batching: bool
    responses: Iterator[tuple[InferResponse | TritonError | None, bool]]


def _one_response(reply: Reply[InferResponse]) -> Iterator[tuple[InferResponse | TritonError | None, bool]]:
    try:
        response: InferResponse | TritonError = reply.get()
    except TritonError as e:
        response = e
    yield response, True


class DataPlane:
    """Stateless facade; every method may be called from any request greenlet."""

    def __init__(self, repository: RepositoryActor, server_id: str = "triton", strict_readiness: bool = True,
                 shm: SharedMemoryRegistry | None = None, runtime: RuntimeSettings | None = None,
                 host: Host | None = None) -> None:
        self.repository = repository
        self.shm = shm or SharedMemoryRegistry()
        self.server_id = server_id
        self.strict_readiness = strict_readiness
        self.live = False  # flipped by the server on start / shutdown
        self.runtime = runtime or RuntimeSettings()  # log and trace settings, shared by HTTP and gRPC
        self.accepting = False
        self.host: Host = host or LocalHost()  # host-wide reads and changes go through it (host/base.py)

    # -- health and metadata ----------------------------------------------------------------------
    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> bool:
        if not (self.live and self.accepting):
            return False
        return self.repository.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return payloads.server_metadata(self.server_id, SERVER_VERSION)

    def _version(self, name: str, version: int) -> tuple[ModelHandle, VersionHandle]:
        handle = self.repository.lookup(name)
        return handle, handle.resolve(version)

    def model_ready(self, name: str, version: int) -> bool:
        """Raises like Triton for unknown models / unready explicit versions; True otherwise."""
        _, vh = self._version(name, version)
        return vh.state == READY

    def model_metadata(self, name: str, version: int) -> dict[str, Any]:
        handle, vh = self._version(name, version)
        versions = [vh.version] if version >= 0 else list(handle.ready_versions)
        return payloads.model_metadata(name, versions, handle.config)

    def model_config(self, name: str, version: int) -> dict[str, Any]:
        return config_mod.to_json_dict(self.model_config_message(name, version))

    def model_config_message(self, name: str, version: int) -> Any:
        """The model's ``ModelConfig`` protobuf (gRPC ModelConfig answers it as is)."""
        handle, _ = self._version(name, version)
        return handle.config

    # -- inference --------------------------------------------------------------------------------
    def is_known(self, name: str) -> bool:
        return name in self.repository.routes

    def is_decoupled(self, name: str) -> bool:
        handle = self.repository.routes.get(name)
        return handle is not None and handle.config is not None and handle.config.model_transaction_policy.decoupled

    def reject_decoupled(self, name: str) -> None:
        """``/infer`` (one request, one response) refuses decoupled models, as Triton does (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/decoupled_models.md)."""
        if self.is_decoupled(name):
            raise TritonError.unsupported("HTTP end point doesn't support models with decoupled transaction policy")

    def _route(self, request: InferRequest, internal: bool = False) -> tuple[ModelHandle, VersionHandle]:
        """The version that serves ``request``, with Triton's errors. The caller enqueues right after,
        without yielding, so a reload's swap cannot slip in between. ``internal``: a request made by a
        model (BLS), served while the server drains at shutdown too, as Triton core allows."""
        if not self.accepting and not internal:
            raise TritonError.unavailable("Server not ready")
        handle = self.repository.routes.get(request.model_name)
        if handle is None:
            raise TritonError.not_found(f"Request for unknown model: '{request.model_name}' is not found")
        return handle, handle.resolve(request.model_version)

    def infer(self, request: InferRequest, internal: bool = False) -> Served:
        """Route, validate, queue, wait (this greenlet only)."""
        pending = self.infer_start(request, internal)
        return Served(pending.reply.get(), pending.version, pending.labels, pending.batching)

    def infer_start(self, request: InferRequest, internal: bool = False) -> Pending:
        """Route, validate and queue without waiting: for a caller that answers later, or at once
        when a quick model already answered (``pending.reply.ready()``)."""
        handle, vh = self._route(request, internal)
        return Pending(vh.infer(request), vh.version, vh.labels, handle.config.max_batch_size > 0)

    def infer_stream(self, request: InferRequest, internal: bool = False,
                     account: StreamAccount | None = None) -> Streamed:
        """Route, validate and queue a request whose answers are streamed: any number of responses
        from a decoupled model, exactly one from any other. Errors before queueing raise here. A
        decoupled model's ``send()`` waits while the consumer has not taken ``STREAM_MAX_RESPONSES``
        of them or ``STREAM_MAX_BYTES`` (runtime/response_channel.py): a client that reads slowly,
        or not at all, holds back the model instead of filling memory. ``account``: that bound is the
        client stream's, shared with its other requests (gRPC ModelStreamInfer)."""
        handle, vh = self._route(request, internal)
        batching = handle.config.max_batch_size > 0
        if not handle.config.model_transaction_policy.decoupled:
            return Streamed(vh.version, vh.labels, batching, _one_response(vh.infer(request)))
        # a client's stream that stops reading ends the request (STREAM_STALL_SECS); a model's BLS call waits
        channel = BoundedResponseChannel(STREAM_MAX_RESPONSES, STREAM_MAX_BYTES, account,
                                         None if internal else STREAM_STALL_SECS)
        try:
            reply = vh.infer(request._replace(responses=channel))
        except BaseException:
            channel.close()
            raise
        reply.link(lambda r: channel.send(r.exception(), True) if r.exception() is not None else None)
        return Streamed(vh.version, vh.labels, batching, ChannelResponses(channel))

    def input_specs(self, name: str, version: int) -> tuple[list[tuple[str, DType, tuple[int, ...]]], int]:
        """Every input's name, type and dims, and max_batch_size (the generate extension builds tensors from them)."""
        handle, _ = self._version(name, version)
        cfg = handle.config
        return [(i.name, BY_ENUM_VALUE[i.data_type], tuple(i.dims)) for i in cfg.input], cfg.max_batch_size

    def input_names(self, name: str, version: int) -> Container[str] | None:
        """The inputs the version that would serve a request takes (its validator's), so a decoder can
        refuse a request naming more inputs than the model has before converting them; None when
        there is no such version (yet): the request then gets its answer where it is routed."""
        try:
            _, vh = self._version(name, version)
        except TritonError:
            return None
        return vh.validator.inputs if vh.validator is not None else None

    def raw_input_spec(self, name: str, version: int) -> tuple[str, DType, tuple[int, ...], int]:
        """The single input a raw binary request feeds (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md)."""
        handle, _ = self._version(name, version)
        cfg = handle.config
        if len(cfg.input) != 1:
            raise TritonError.invalid_arg(
                f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got "
                f"{len(cfg.input)} inputs in '{name}' model configuration"
            )
        i = cfg.input[0]
        return i.name, BY_ENUM_VALUE[i.data_type], tuple(i.dims), cfg.max_batch_size

    # -- statistics and repository ----------------------------------------------------------------
    def statistics(self, name: str, version: int) -> dict[str, Any]:
        if name:
            handle = self.repository.routes.get(name)
            if handle is None or not handle.ready_versions:
                raise TritonError.invalid_arg(f"requested model '{name}' is not available")
            if version >= 0:
                vh = handle.versions.get(version)
                if vh is None or vh.state != READY:
                    raise TritonError.invalid_arg(f"requested model version is not available for model '{name}'")
        # every worker's counters, added up (one process: just this one's)
        per_worker = self.host.gather("statistics", {"name": name, "version": version})
        stats = [payloads.model_statistics(snap) for snap in hostwide.sum_statistics(per_worker)]
        return {"model_stats": stats}

    def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        return self.repository.ref.index(ready_only, timeout=60)

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Repository extension ``load`` (HTTP and gRPC). ``parameters``: ``config`` (JSON text) and
        ``file:<version>/<name>`` (bytes) overrides, already decoded by the front end; other keys are
        ignored. Returns once the load finished; raises its error (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md)."""
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise TritonError.internal(f"failed to load '{name}': the 'config' parameter must be a JSON string")
        if config is not None:
            check_config_size(name, config)  # before the workers journal or any of them parses it
        files = {k: v for k, v in parameters.items() if k.startswith(FILE_PREFIX)}
        for key, value in files.items():
            if not isinstance(value, bytes):
                raise TritonError.invalid_arg(f"failed to load '{name}': file override '{key}' must be bytes")
        self.host.broadcast("model.load", {"name": name, "config": config, "files": files})

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        """Repository extension ``unload`` (HTTP and gRPC): returns before the model is gone."""
        self.host.broadcast("model.unload", {"name": name, "unload_dependents": unload_dependents})

"""One request's route: the model and version that serve it, looked up once and shared by the request's
decode, its enqueue and its encode.

A front end asks :meth:`.dataplane.DataPlane.route` for it as soon as it knows the model's name and
version (the URL, the gRPC message's fields) and passes it on: the decoder reads the model's inputs and
raw-input spec from it, the data plane queues the request with its version, the encoder takes the
version, labels and batching from it. Looking the version up again at each step cost a request two
more routing-table reads and ``resolve`` calls, and let two steps of one request see two different
versions across a reload.

A route is a value: it never raises when it is made. Why no version serves the request (an unknown
model, an unready version, a server that no longer accepts requests) is kept in it and raised where
the request is queued, after its body was decoded, which is where those errors came before routes
existed (a bad body is answered as a bad body, as Triton answers it). The data plane checks, without
yielding, that the routing table still holds the route's model handle when it queues the request, and
routes again if a reload swapped it meanwhile (a big body decoded on a native thread takes that long).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from ..actors.model.handles import ModelHandle, VersionHandle
from ..errors import TritonError
from ..protocol.dtypes import BY_ENUM_VALUE, DType
from ..repository.config import ModelConfig
from ..runtime.kernel import Reply

NOT_ACCEPTING = "Server not ready"  # Triton's answer while it shuts down


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request for ``name`` version ``requested`` (-1: the highest ready) goes.

    ``model``: the routing table's handle (None for an unknown model); ``target``: the version that serves
    the request (None when ``error`` says why none does); ``closed``: the server no longer accepts
    requests from clients (``internal`` requests, a model's BLS calls, are served while it drains)."""

    name: str
    requested: int
    model: ModelHandle | None
    target: VersionHandle | None
    error: TritonError | None
    closed: bool = False
    internal: bool = False
    # the model is loading on demand (plane/on_demand.py): the request waits for it, then is routed again
    loading: Reply[None] | None = None
    # what every request's decode reads, worked out once per route (the data plane reuses a route while its
    # model handle is current): the config's transaction policy and the serving version's input names
    _decoupled: bool = field(default=False, init=False, repr=False, compare=False)
    _inputs: Container[str] | None = field(default=None, init=False, repr=False, compare=False)
    # the version that serves the request (None: serving() raises why none does) and what an encoder reads
    # of it, worked out once: each was a property and serving()'s checks per read, three to five a request
    _serves: VersionHandle | None = field(default=None, init=False, repr=False, compare=False)
    encoding: tuple[int, dict[str, list[str]], bool] | None = field(default=None, init=False, repr=False,
                                                                     compare=False)

    def __post_init__(self) -> None:
        cfg = self.model.config if self.model is not None else None
        object.__setattr__(self, "_decoupled", cfg is not None and cfg.model_transaction_policy.decoupled)
        target = self.target
        if target is not None and target.validator is not None:
            object.__setattr__(self, "_inputs", target.validator.inputs)
        if target is not None and not self.closed and cfg is not None:
            object.__setattr__(self, "_serves", target)
            object.__setattr__(self, "encoding", (target.version, target.labels, cfg.max_batch_size > 0))

    def serving(self) -> VersionHandle:
        """The version to queue the request with; Triton's error when there is none."""
        target = self._serves
        if target is not None:
            return target
        if self.closed:
            raise TritonError.unavailable(NOT_ACCEPTING)
        if self.target is None:
            assert self.error is not None
            # the route is shared by every request for it while it is current: each raise starts a fresh
            # traceback, or one error would carry every failed request's frames (and hold them)
            raise self.error.with_traceback(None)
        return self.target

    # -- what the decoder and encoder read ------------------------------------------------------
    @property
    def decoupled(self) -> bool:
        return self._decoupled

    def refuse_decoupled(self, message: str) -> None:
        """One request, one response (HTTP ``/infer``, gRPC ``ModelInfer``) refuses decoupled models, as
        Triton does (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/decoupled_models.md)."""
        if self._decoupled:
            raise TritonError.unsupported(message)

    @property
    def inputs(self) -> Container[str] | None:
        """The serving version's input names (its validator's), so a decoder can refuse a request naming
        more inputs than the model has before converting them; None when no version serves it."""
        return self._inputs

    @property
    def version(self) -> int:
        target = self._serves
        return (target if target is not None else self.serving()).version

    @property
    def labels(self) -> dict[str, list[str]]:
        return self.serving().labels

    @property
    def batching(self) -> bool:
        return self._config().max_batch_size > 0

    def _config(self) -> ModelConfig:
        """The config of a model a version of which serves the request (Triton's error otherwise)."""
        if self.model is None or self.target is None:
            assert self.error is not None
            raise self.error.with_traceback(None)  # as in serving()
        return self.model.config

    def input_specs(self) -> tuple[list[tuple[str, DType, tuple[int, ...]]], int]:
        """Every input's name, type and dims, and max_batch_size (the generate extension builds tensors from them)."""
        cfg = self._config()
        return [(i.name, BY_ENUM_VALUE[i.data_type], tuple(i.dims)) for i in cfg.input], cfg.max_batch_size

    def raw_input_spec(self) -> tuple[str, DType, tuple[int, ...], int]:
        """The single input a raw binary request feeds (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md)."""
        cfg = self._config()
        if len(cfg.input) != 1:
            raise TritonError.invalid_arg(
                f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got "
                f"{len(cfg.input)} inputs in '{self.name}' model configuration"
            )
        i = cfg.input[0]
        return i.name, BY_ENUM_VALUE[i.data_type], tuple(i.dims), cfg.max_batch_size

"""The one data plane behind every front end: decode → **call** → encode, this is the call part.

Front ends (HTTP now, gRPC later) turn wire messages into these calls and the results back into wire
messages. It reads the repository actor's published routing table (no round trip on the hot path);
lifecycle calls and the index go through the typed :class:`~..actors.repository.messages.RepositoryRef`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import gevent

from ..actors.model.handles import READY, ModelHandle, VersionHandle
from ..actors.repository.actor import RepositoryActor
from ..actors.scheduling.rate_limiter import RateLimiter
from ..errors import TritonError
from ..host import handlers as hostwide
from ..host.base import Host, LocalHost
from ..host.shared_memory import SharedMemoryRegistry
from ..inference import InferRequest, InferResponse
from ..observability.log_trace_settings import RuntimeSettings
from ..observability.wire_trace import WireTrace
from ..protocol import payloads
from ..repository import config as config_mod
from ..repository.overrides import FILE_PREFIX, ConfigText, check_config_size
from ..runtime.fastpath import BoundedCache
from ..runtime.kernel import Reply
from ..runtime.process_memory import trim_heap
from ..runtime.response_channel import (
    STREAM_MAX_BYTES,
    STREAM_MAX_RESPONSES,
    STREAM_STALL_SECS,
    BoundedResponseChannel,
    ChannelResponses,
    OpenStreams,
    StreamAccount,
)
from .memory_budget import MemoryBudget
from .on_demand import OnDemand
from .route import Route
from .tune_report import TuneReport

ON_DEMAND_LOCK_TIMEOUT_S = 600.0  # another worker's load on demand: as long as a load may take
_ROUTES_CACHED = 1024  # (model, version) pairs clients name; a full cache is cleared and refills in a request each

# an override or file overrides this big leave freed copies that glibc keeps (runtime/process_memory.py);
# a small one is not worth the trim's walk of the heap
TRIM_AFTER_BYTES = 1 << 20
SERVER_VERSION = "2.51.0"  # the Triton release whose protocol we speak (clients compare versions)


@dataclass(slots=True)
class Served:
    """A finished inference with the route the encoder reads the model's version, labels and batching from."""

    response: InferResponse
    route: Route


@dataclass(slots=True)
class Pending:
    """A queued inference: ``reply`` completes with the response; ``route`` is what the encoder reads.
    ``hit``: the response cache's answer, found before the scheduler (``cache_front.py``, a fast path),
    which the front end answers from (``reply`` is then set, with no response in it)."""

    reply: Reply[InferResponse]
    route: Route
    hit: Any = None


@dataclass(slots=True)
class Streamed:
    """A streaming inference: ``responses`` yields ``(InferResponse | TritonError | None, final)``;
    None is a final flag without a response. Closing the iterator early cancels the request (also
    before its first item): the consumer must close it when it stops before the final response."""

    route: Route
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
                 host: Host | None = None, streams: OpenStreams | None = None) -> None:
        self.repository = repository
        self.shm = shm or SharedMemoryRegistry()
        self.server_id = server_id
        self.strict_readiness = strict_readiness
        self.live = False  # flipped by the server on start / shutdown
        self.runtime = runtime or RuntimeSettings()  # log and trace settings, shared by HTTP and gRPC
        self.tracer = self.runtime.tracer  # its ``otel`` is read once per request: set in OpenTelemetry mode only
        self.accepting = False
        self.host: Host = host or LocalHost()  # host-wide reads and changes go through it (host/base.py)
        # the server's open response channels: what clients' streams hold (/status.json's streams)
        self.streams = streams or OpenStreams()
        self.on_demand: OnDemand | None = None  # --model-load-on-demand (plane/on_demand.py), set by the server
        self.budget: MemoryBudget | None = None  # --model-memory-budget (plane/memory_budget.py), set by the server
        self.rate_limiter: RateLimiter | None = None  # --rate-limit=execution_count's, for the status page
        # routes that found a version, by (name, version, closed, internal), made from the current routing table
        # (a route held on after its model's unload would keep its instances alive)
        self._routes: BoundedCache[tuple[str, int, bool, bool], Route] = BoundedCache("plane.routes", _ROUTES_CACHED)
        self._routes_of: object = None  # the routing table those routes were made from
        self.tune_report = TuneReport()  # the last `tune --url` run's report, linked from the status page

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

    def route(self, name: str, version: int, internal: bool = False) -> Route:
        """Where a request for ``name`` version ``version`` goes (plane/route.py): looked up once, shared
        by the request's decode, enqueue and encode. Never raises: the reason no version serves it is
        raised when the request is queued. ``internal``: a request made by a model (BLS), served while
        the server drains at shutdown too, as Triton core allows. With ``--model-load-on-demand``, a model
        of the repository that has no ready version starts loading here (the route carries the load)."""
        table = self.repository.routes
        if table is not self._routes_of:  # a new table (any load, unload or state change): old routes go
            self._routes.clear()
            self._routes_of = table
        model = table.get(name)
        closed = not self.accepting and not internal
        if model is None:
            error = TritonError.not_found(f"Request for unknown model: '{name}' is not found")
            return Route(name, version, None, None, error, closed, internal, self._load_on_demand(name, closed))
        if self.budget is not None:  # least recently used first out of the budget (known names only: bounded)
            self.budget.touch(name)
        # a route is a value of the routing table (immutable, swapped on every change), so the one made from
        # the same table is reused (fast path): it saves a resolve and a frozen dataclass's construction per
        # request (11 attribute writes through object.__setattr__)
        key = (name, version, closed, internal)
        route = self._routes.get(key)
        if route is not None:
            return route
        try:
            route = Route(name, version, model, model.resolve(version), None, closed, internal)
        except TritonError as e:
            loading = self._load_on_demand(name, closed) if not model.ready_versions else None
            return Route(name, version, model, None, e.with_traceback(None), closed, internal, loading)
        self._routes.put(key, route)
        return route

    def _load_on_demand(self, name: str, closed: bool) -> Reply[None] | None:
        if self.on_demand is None or closed:
            return None
        return self.on_demand.start(name)

    def _serving(self, request: InferRequest, route: Route | None,
                 internal: bool) -> tuple[Route, VersionHandle | None]:
        """``route``'s version for ``request``, routed again when there is no route yet, or when the
        routing table no longer holds its model handle (a reload swapped it while the request was
        decoded). The caller enqueues right after, without yielding, so no swap slips in between. None
        for the version: the model is loading on demand (``route.loading``)."""
        if route is None or route.model is not self.repository.routes.get(request.model_name) or \
                route.name != request.model_name or route.requested != request.model_version or \
                route.closed != (not self.accepting and not route.internal):
            route = self.route(request.model_name, request.model_version, internal)
        if route.target is None and route.loading is not None and not route.closed:
            return route, None
        return route, route.serving()

    def loaded(self, route: Route, timeout_us: int = 0) -> Route:
        """``route`` itself, or, when it carries an on-demand load, the route after that load (waiting for
        it in this greenlet: a request's own, never a connection's reader)."""
        if route.loading is None or route.target is not None or route.closed:
            return route
        assert self.on_demand is not None
        self.on_demand.wait(route.name, route.loading, timeout_us)
        return self.route(route.name, route.requested, route.internal)

    def _loaded(self, request: InferRequest, route: Route) -> tuple[Route, VersionHandle]:
        route = self.loaded(route, request.timeout_us)
        return route, route.serving()

    def infer(self, request: InferRequest, internal: bool = False, route: Route | None = None) -> Served:
        """Route, validate, queue, wait (this greenlet only)."""
        pending = self.infer_start(request, internal, route)
        return Served(pending.reply.get(), pending.route)

    def infer_start(self, request: InferRequest, internal: bool = False, route: Route | None = None,
                    traceparent: str | WireTrace | None = None) -> Pending:
        """Route (unless ``route`` is given and current), validate and queue without waiting: for a
        caller that answers later, or at once when a quick model already answered (``pending.reply.ready()``).
        A model loading on demand: the request waits for the load in a greenlet of its own (the caller may be
        a connection's reader, which must not wait), and ``pending.route`` is the route it got after.
        ``traceparent``: the W3C header the client sent (OpenTelemetry mode, observability/otel.py), or the
        front end's :class:`~..observability.wire_trace.WireTrace` that carries it (its receive and send
        events go on the request's ``InferRequest`` span, which the front end then ends after its send)."""
        route, target = self._serving(request, route, internal)
        if target is not None:
            return Pending(self._start(target, request, internal, traceparent), route)
        pending = Pending(Reply(), route)
        gevent.spawn(self._queue_after_load, request, pending, internal, traceparent)
        return pending

    def _start(self, target: VersionHandle, request: InferRequest, internal: bool,
               traceparent: str | WireTrace | None) -> Reply[InferResponse]:
        """Queue ``request`` with ``target``, traced when OpenTelemetry mode samples it."""
        if self.tracer.otel is None or internal:
            if isinstance(traceparent, WireTrace) and not internal:  # trace file: stamped on the wire too
                return self.tracer.wired_infer(target.infer, request, traceparent)
            return target.infer(request)
        request, root = self._traced(request, traceparent)
        reply = target.infer(request)
        if root is None:
            return reply
        if isinstance(traceparent, WireTrace):  # the front end stamps its send and ends the span after it
            traceparent.begun(root)
            reply.link(lambda _r: traceparent.answered())
        else:
            reply.link(lambda _r: request.trace.close(root, ()))
        return reply

    def _traced(self, request: InferRequest, traceparent: str | WireTrace | None) -> tuple[InferRequest, Any]:
        """``request`` with its SpanTrace when sampled, and its ``InferRequest`` span to end with its reply."""
        if isinstance(traceparent, WireTrace):
            traceparent = traceparent.traceparent
        begun = self.tracer.begin(request.model_name, traceparent, time.perf_counter_ns())
        if begun is None:
            return request, None
        root, span_trace = begun
        return request._replace(trace=span_trace), root

    def _queue_after_load(self, request: InferRequest, pending: Pending, internal: bool,
                          traceparent: str | WireTrace | None) -> None:
        outer = pending.reply
        try:
            pending.route, target = self._loaded(request, pending.route)
            if outer.ready():  # the client went away meanwhile
                return
            inner = self._start(target, request, internal, traceparent)
        except TritonError as e:
            outer.fail(e)
            return
        inner.link(lambda r: outer.fail(r.exception()) if r.exception() is not None else outer.set(r.value()))
        # the front end fails its reply when the client goes away: the queued request is cancelled too
        outer.link(lambda r: inner.fail(r.exception()) if r.exception() is not None else None)

    def infer_stream(self, request: InferRequest, internal: bool = False,
                     account: StreamAccount | None = None, route: Route | None = None,
                     traceparent: str | None = None) -> Streamed:
        """Route, validate and queue a request whose answers are streamed: any number of responses
        from a decoupled model, exactly one from any other. Errors before queueing raise here. A
        decoupled model's ``send()`` waits while the consumer has not taken ``STREAM_MAX_RESPONSES``
        of them or ``STREAM_MAX_BYTES`` (runtime/response_channel.py): a client that reads slowly,
        or not at all, holds back the model instead of filling memory. ``account``: that bound is the
        client stream's, shared with its other requests (gRPC ModelStreamInfer). ``traceparent``: as
        :meth:`infer_start`'s (the root span ends with the request's last answer, or, given a WireTrace,
        after the front end's last send)."""
        route, target = self._serving(request, route, internal)
        if target is None:  # loading on demand: this caller may wait (a request's own greenlet)
            route, target = self._loaded(request, route)
        root = infer = None
        if self.tracer.otel is not None and not internal:
            request, root = self._traced(request, traceparent)
            if root is not None and isinstance(traceparent, WireTrace):  # the front end ends it (grpc_stream_call.py)
                traceparent.begun(root)
                root = None
        elif isinstance(traceparent, WireTrace) and not internal:  # trace file: stamped on the wire too
            infer = partial(self.tracer.wired_infer, target.infer, wire=traceparent)
        infer = infer or target.infer
        if not route.decoupled:
            reply = infer(request)
            if root is not None:
                reply.link(lambda _r: request.trace.close(root, ()))
            return Streamed(route, _one_response(reply))
        # a client's stream that stops reading ends the request (STREAM_STALL_SECS); a model's BLS call waits
        channel = BoundedResponseChannel(STREAM_MAX_RESPONSES, STREAM_MAX_BYTES, account,
                                         None if internal else STREAM_STALL_SECS, self.streams)
        try:
            reply = infer(request._replace(responses=channel))
        except BaseException:
            channel.close()
            raise
        reply.link(lambda r: channel.send(r.exception(), True) if r.exception() is not None else None)
        if root is not None:
            reply.link(lambda _r: request.trace.close(root, ()))
        return Streamed(route, ChannelResponses(channel))

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

    def load_model(self, name: str, parameters: dict[str, Any], demand: bool = False) -> None:
        """Repository extension ``load`` (HTTP and gRPC). ``parameters``: ``config`` (JSON text) and
        ``file:<version>/<name>`` (bytes) overrides, already decoded by the front end (its own dict: the
        ``config`` is popped from it); other keys are
        ignored. Returns once the load finished; raises its error (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md).
        ``demand``: a request started it (plane/on_demand.py), which POLL mode allows too."""
        # popped, not read: the front end's parameters (its decode's own dict) keep no reference to the text
        config: str | ConfigText | None = parameters.pop("config", None)
        if config is not None and not isinstance(config, str):
            raise TritonError.internal(f"failed to load '{name}': the 'config' parameter must be a JSON string")
        size = len(config) if config is not None else 0
        if config is not None:
            check_config_size(name, config)  # before the workers journal or any of them parses it
            if not self.host.journals:  # one process: the parse takes the text and it goes (issue 23)
                config = ConfigText(config)
        files = {k: v for k, v in parameters.items() if k.startswith(FILE_PREFIX)}
        for key, value in files.items():
            if not isinstance(value, bytes):
                raise TritonError.invalid_arg(f"failed to load '{name}': file override '{key}' must be bytes")
            size += len(value)
        args = {"name": name, "config": config, "files": files, **({"demand": True} if demand else {})}
        try:
            if self.budget is not None:  # room made first, footprint measured
                self.budget.load(name, lambda: self.host.broadcast("model.load", args))
            else:
                self.host.broadcast("model.load", args)
        finally:
            if size >= TRIM_AFTER_BYTES:  # the override's copies are freed: their pages go back too
                trim_heap()

    def load_on_demand(self, name: str) -> None:
        """A request's load (plane/on_demand.py): as the load API's, except that a model loaded meanwhile is
        not loaded again. With ``--workers`` a request in each worker may start one for the same model; the
        first loads it in every worker, the others find it loaded (one at a time: the host lock)."""
        if self.budget is not None:
            self.budget.load(name, lambda: self.host.broadcast("model.load", {"name": name, "config": None, "files": {},
                                                                              "demand": True}), if_absent=True)
            return
        with self.host.exclusive("load-on-demand", ON_DEMAND_LOCK_TIMEOUT_S):
            handle = self.repository.routes.get(name)
            if handle is None or not handle.ready_versions:
                self.load_model(name, {}, demand=True)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        """Repository extension ``unload`` (HTTP and gRPC): returns before the model is gone."""
        self.host.broadcast("model.unload", {"name": name, "unload_dependents": unload_dependents})

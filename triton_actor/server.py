"""The server: builds the actor tree and the front ends, runs until a signal, shuts down cleanly.

Ownership tree: Server → RepositoryActor → ModelActors → per version a SchedulerActor and its
ModelInstances; the RepositoryActor supervises the ModelActors (restart within a budget, see
``actors/repository/actor.py``). Shutdown (SIGINT/SIGTERM): stop accepting, let in-flight requests finish (up to
``--exit-timeout-secs``), ``finalize()`` every model, exit 0.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import gevent
import gevent.event

from . import cache as response_cache
from .actors.model.messages import LoadSettings
from .actors.repository.actor import RepositoryActor
from .actors.scheduling.rate_limiter import RateLimiter
from .backends.base import Backend
from .backends.devices import gpu_count
from .backends.identity import IdentityBackend
from .backends.onnxruntime import OnnxRuntimeBackend
from .backends.python.backend import PythonBackend
from .backends.python.triton_python_backend_utils.serving import MetricRegistry, ServerHooks
from .backends.pytorch import PyTorchBackend
from .config.settings import Settings
from .errors import TritonError
from .frontends.budget import ByteBudget
from .frontends.compression import inflation_limit
from .frontends.descriptors import ConnectionSlots, region_total
from .frontends.grpc import GrpcServicer
from .frontends.grpc_h2 import GrpcH2Server
from .frontends.http import HttpFrontend
from .frontends.http_routes import create_app, openai_app
from .frontends.http_server import HttpServer
from .frontends.metrics_server import MetricsServer
from .frontends.offload import Offload
from .frontends.openai_routes import OpenAIOptions
from .host import handlers as hostwide
from .host.base import Host, LocalHost
from .host.metrics_snapshot import MetricsSource
from .host.shared_memory import SharedMemoryRegistry
from .metrics.statsd_push import StatsdPusher
from .observability import log_format
from .observability.log_trace_settings import RuntimeSettings
from .observability.tracing import Tracer
from .plane import live_status
from .plane.calls_from_models import ServerCalls
from .plane.dataplane import DataPlane
from .plane.memory_budget import MemoryBudget
from .plane.memory_budget import families as budget_families
from .plane.on_demand import OnDemand
from .protocol import header_forward, http1
from .protocol.restricted import Restrictions
from .repository import remote
from .repository.remote import RemoteRepository
from .runtime import gc_settle, hub_errors
from .runtime.process_memory import tree_bytes
from .runtime.response_channel import OpenStreams

log = logging.getLogger("triton_actor.server")


def default_backends(backend_config: dict[str, dict[str, str]] | None = None) -> dict[str, Backend]:
    """Every backend we ship; heavy runtimes (onnxruntime, torch) are imported only when a model loads."""
    return {
        "python": PythonBackend(backend_config),
        "onnxruntime": OnnxRuntimeBackend(backend_config),
        "pytorch": PyTorchBackend(backend_config),
        "identity": IdentityBackend(backend_config),  # Triton's test backend: its qa suites serve it
    }


class StartupError(Exception):
    """A model failed to load at startup and ``--exit-on-error`` is on."""


class Server:
    """Owns the repository actor and the front ends for one process."""

    def __init__(self, settings: Settings, backends: dict[str, Backend] | None = None,
                 host: Host | None = None) -> None:
        self.settings = settings
        hub_errors.install()  # a greenlet's SystemExit is model code's, not a way to end the server
        self.host: Host = host or LocalHost()  # what is host-wide with several workers (host/base.py)
        # this server's own, handed down rather than kept in modules, so two servers in one process share
        # none: the tracer (to every scheduler), the hooks and custom metric families of its Python models,
        # the response channels it has open (/status.json's streams)
        self.tracer = Tracer()
        self.streams = OpenStreams()
        self.model_hooks = ServerHooks(metrics=MetricRegistry())
        # the response cache's store (--cache-config): this server's (each worker's) own, connected in load_models
        self.response_cache = response_cache.create(settings.cache_config)
        # object-store repositories are mirrored into local folders the repository actor reads (remote.py)
        self.mirrors = [RemoteRepository(url, settings.remote_cache_dir) for url in settings.remote_repositories]
        load = LoadSettings(
            gpu_count=gpu_count(),
            auto_complete=settings.auto_complete,
            config_name=settings.model_config_name,
            backend_config=settings.backend_config,
            latency_metrics=(settings.metrics_config.summary_latencies, settings.metrics_config.histogram_latencies),
            workers=settings.workers,
            load_retries=settings.model_load_retry_count,
            tracer=self.tracer,
            server_hooks=self.model_hooks,
            # one rate limiter for all the models (--rate-limit=execution_count); with --workers one per worker,
            # taking its units from the host's (workers/resources.py)
            rate_limiter=(RateLimiter(list(settings.rate_limit_resources), self.host.shared_units())
                          if settings.rate_limit != "off" else None),
            response_cache=self.response_cache,
            streams=self.streams,
            # a model's error names its mirror's URL, not the local copy (repository/public_paths.py)
            public_paths=tuple((str(m.root), m.url.rstrip("/")) for m in self.mirrors),
        )
        backends = backends or default_backends(settings.backend_config)
        self._mirror_poll: gevent.Greenlet | None = None
        refresh = self._sync_mirrors if self.mirrors and settings.model_control_mode == "explicit" else None
        lost = hostwide.LostVersions(self.host)  # a version without instances goes down in every worker
        self.repository = RepositoryActor([*settings.model_repositories, *(m.root for m in self.mirrors)],
                                          backends, load, settings.model_control_mode, settings.load_models,
                                          settings.repository_poll_secs, settings.model_load_thread_count,
                                          refresh=refresh, announce=lost.announce,
                                          on_demand=settings.model_load_on_demand)
        lost.register(self.repository)
        shm = SharedMemoryRegistry(settings.allow_client_shm, load.gpu_count, region_total())
        runtime = RuntimeSettings(trace=settings.trace_config, tracer=self.tracer,
                                  log=log_format.start_settings(settings))
        runtime.tracer.for_worker(self.host.worker_id)  # trace ids and files apart per worker (observability/tracing.py)
        hostwide.register_handlers(self.host, self.repository, shm, runtime)
        self.plane = DataPlane(self.repository, settings.server_id, settings.strict_readiness,
                               hostwide.HostSharedMemory(shm, self.host),  # type: ignore[arg-type]
                               hostwide.HostRuntimeSettings(runtime, self.host),  # type: ignore[arg-type]
                               self.host, self.streams)
        if settings.model_load_on_demand:  # a request loads the model it names, as the load API would
            self.plane.on_demand = OnDemand(self.repository.repositories, self.plane.load_on_demand)
        self.plane.rate_limiter = load.rate_limiter
        if settings.model_memory_budget:  # loads make room first (plane/memory_budget.py)
            self.plane.budget = MemoryBudget(settings.model_memory_budget, self.repository, self.host,
                                             unload_wait_s=settings.exit_timeout_secs)
        self.server_calls = ServerCalls(self.plane, self.model_hooks)  # BLS and model control from Python models
        self.host.register("status", lambda args: live_status.local_status(self.plane, args))  # the status page
        self.host.register("tune.report", lambda args: self.plane.tune_report.set(args["path"]))  # its report link
        # this process's share of /metrics: its models' statistics and custom metric families
        self.metrics_source = MetricsSource(self.repository, self.model_hooks.metrics, self.response_cache,
                                            self._own_families)
        self.host.register("metrics", self.metrics_source)
        self.metrics: MetricsServer | None = None
        self._slots: ConnectionSlots | None = None  # made by serve(), for every port
        self.statsd: StatsdPusher | None = None
        self.http: HttpServer | None = None
        self.frontend: HttpFrontend | None = None
        self.openai: HttpServer | None = None  # --openai-port's
        self.openai_frontend: HttpFrontend | None = None
        self.grpc: GrpcH2Server | None = None
        self._stopped = gevent.event.Event()
        self._stopping = False

    @property
    def http_port(self) -> int:
        assert self.http is not None
        return self.http.server_port

    def start(self) -> None:
        """Listen (live, not ready), load every model, then accept inference."""
        self.start_actors()
        self.serve()
        self.load_models()
        gc_settle.settle()  # before the first request: what loading left is not walked by every collection
        self.plane.accepting = True

    def start_actors(self) -> None:
        """The repository actor (nothing loaded yet), with the hooks models call the server through."""
        self.server_calls.install()
        self.repository.start()

    def serve(self, listeners: dict[str, Any] | None = None) -> None:
        """Start the front ends; ``listeners`` (``"http"``, ``"grpc"``, ``"metrics"``): sockets bound already
        (a worker's)."""
        s = self.settings
        listeners = listeners or {}
        budget = ByteBudget(s.request_memory_budget, s.request_body_min_rate)  # one for both front ends
        slots = self._slots = ConnectionSlots()  # one descriptor count for every port
        offload = Offload()  # one big conversion off the hub at a time, for both front ends
        if s.allow_grpc:
            self.grpc = GrpcH2Server.from_settings(GrpcServicer(self.plane, offload, self.response_cache is not None), s, budget, slots)
            log.info("Started GRPCInferenceService at %s:%d", s.grpc_address, self.grpc.start(listeners.get("grpc")))
        if s.allow_http:
            forward = header_forward.compile_pattern(s.http_header_forward_pattern)
            self.frontend = HttpFrontend(create_app(self.plane, forward, offload, self._openai_options(),
                                                    caching=self.response_cache is not None),
                                         inflation_limit(s),
                                         Restrictions(s.http_restricted_api, "--http-restricted-api"))
            self.http = HttpServer(s.http_address, s.http_port, self.frontend, self._http_limits(),
                                   s.http_max_connections, listeners.get("http"), budget, slots,
                                   reuse_port=s.reuse_http_port, tracer=self.plane.tracer)
            self.http.start()
            log.info("Started HTTPService at %s:%d", s.http_address, self.http.server_port)
        if s.openai_port is not None:
            self._start_openai(budget, slots)
        self._start_metrics(listeners.get("metrics"))
        self.plane.live = True

    def load_models(self) -> None:
        """Load the models the control mode starts with; raises StartupError under --exit-on-error.
        Object-store repositories are downloaded first (a bucket that cannot be read: StartupError)."""
        s = self.settings
        try:
            if self.response_cache is not None:
                self.response_cache.open()  # a Redis that does not answer stops the start, as Triton's
            self._sync_mirrors()
        except TritonError as e:
            raise StartupError(e.message) from None
        if self.mirrors and s.model_control_mode == "poll" and s.repository_poll_secs > 0:
            self._mirror_poll = gevent.spawn(remote.poll, self.mirrors, s.repository_poll_secs, self.repository.nudge)
        before = tree_bytes(unique=True) if self.plane.budget is not None else 0
        failures = self.repository.ref.load_all().get()
        if self.plane.budget is not None:  # the startup models are pinned, their memory held back from the budget
            self.plane.budget.pin([n for n, h in self.repository.routes.items() if h.ready_versions],
                                  tree_bytes(unique=True) - before)
        for name, reason in sorted(failures.items()):
            log.error("model '%s' failed to load: %s", name, reason)
        if failures and self.settings.exit_on_error:
            raise StartupError(f"{len(failures)} model(s) failed to load: {', '.join(sorted(failures))}")
        log.info("server is ready: %d model(s) loaded, %d failed",
                 len(self.repository.routes) - len(failures), len(failures))

    def _own_families(self) -> list[dict[str, Any]]:
        spans = self.tracer.families()
        if self.plane.on_demand is None:
            return spans
        return [*spans, *budget_families(self.plane.on_demand.started, self.plane.budget)]

    def _openai_options(self) -> OpenAIOptions:
        s = self.settings
        return OpenAIOptions(s.tokenizer, s.default_max_tokens, s.openai_restricted_api, s.model_repositories)

    def _start_openai(self, budget: ByteBudget, slots: ConnectionSlots) -> None:
        """``--openai-port``: the /v1 routes alone, as Triton's OpenAI frontend serves them on its port
        (workers share the port with SO_REUSEPORT, as they share the others through the arbiter)."""
        s = self.settings
        self.openai_frontend = HttpFrontend(openai_app(self.plane, self._openai_options()), s.http_max_input_size,
                                            name="openai")
        self.openai = HttpServer(s.http_address, s.openai_port or 0, self.openai_frontend, self._http_limits(),
                                 s.http_max_connections, None, budget, slots, reuse_port=s.workers > 1)
        self.openai.start()
        log.info("Started OpenAI-compatible HTTP service at %s:%d", s.http_address, self.openai.server_port)

    def _http_limits(self) -> http1.Limits:
        """The HTTP port's bounds (the metrics port has them too)."""
        s = self.settings
        return http1.Limits(max_body=s.http_max_input_size, header_timeout=s.http_header_timeout_secs,
                            body_timeout=s.http_body_timeout_secs, keepalive_timeout=s.http_keepalive_timeout_secs,
                            send_timeout=s.http_send_timeout_secs, min_rate=s.request_body_min_rate,
                            body_grace=s.request_body_grace_secs)

    def _start_metrics(self, listener: Any = None) -> None:
        """``/metrics`` (on ``listener``, a bound listening socket, or on the flags' address and port) and
        the StatsD push (every worker pushes its own changes, which StatsD adds up: statsd_push.py)."""
        s = self.settings
        if s.allow_metrics:
            self.metrics = MetricsServer(self.host, s.metrics_config, listener or (s.metrics_address, s.metrics_port),
                                         s.metrics_interval_ms / 1000, self._http_limits(), self._slots,
                                         s.allow_cpu_metrics, s.allow_gpu_metrics)
            log.info("Started Metrics Service at %s:%d", s.metrics_address, self.metrics.start())
        if s.statsd_host:
            system = (lambda: self.metrics.sampler.values) if self.metrics is not None else None
            self.statsd = StatsdPusher(lambda: self.metrics_source({}), s.statsd_host, s.statsd_port,
                                       s.statsd_prefix, s.statsd_interval_ms / 1000, system, s.statsd_tags)
            self.statsd.start()
            log.info("Pushing metrics to StatsD at %s:%d every %d ms", s.statsd_host, s.statsd_port,
                     s.statsd_interval_ms)

    def stop(self, handover: bool = False) -> None:
        """Stop accepting, drain in-flight requests, finalize the models (idempotent).

        ``handover`` (a worker leaving while others serve): requests that still arrive on open
        connections are served, not refused -- HTTP answers them with ``Connection: close`` and gRPC
        refuses only new streams after its GOAWAY (clients retry those elsewhere) -- so a rolling restart
        fails none. A lone server refuses them ("Server not ready"), as Triton does at shutdown."""
        if self._stopping:
            self._stopped.wait()
            return
        self._stopping = True
        # one deadline for the whole exit, as Triton's --exit-timeout-secs: the unload below gets what is left
        # (a stuck request made it wait the timeout twice: 32 s with 15)
        deadline = time.monotonic() + self.settings.exit_timeout_secs
        log.info("shutting down: waiting up to %.0f s for in-flight requests", self.settings.exit_timeout_secs)
        if not handover:
            self.plane.accepting = False
        grpc_stop = gevent.spawn(self.grpc.stop, self.settings.exit_timeout_secs) if self.grpc is not None else None
        if self.http is not None:
            self.http.close()  # no new connections; requests already being handled run to completion
            if not self.frontend.wait_idle(self.settings.exit_timeout_secs):
                log.warning("%d request(s) still running after %.0f s", self.frontend.in_flight,
                            self.settings.exit_timeout_secs)
            # a keep-alive client that sends its next request now is answered (with Connection: close)
            # rather than cut off mid-send: busy clients leave by themselves within a request's time
            self.http.wait_closed(min(2.0, self.settings.exit_timeout_secs))
            self.http.stop(timeout=1)
        if self.openai is not None:  # streams a client still reads end with the drain's deadline
            self.openai.close()
            self.openai_frontend.wait_idle(self.settings.exit_timeout_secs)
            self.openai.stop(timeout=1)
        if grpc_stop is not None:
            grpc_stop.join()  # gRPC refuses new RPCs and waits for running ones, alongside HTTP's drain
        self.plane.accepting = False
        if self.statsd is not None:
            self.statsd.stop()  # one last push: the requests that just finished
        if self.metrics is not None:
            self.metrics.stop()
        try:
            self.repository.ref.unload_all().get(max(1.0, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001
            log.error("unloading models at shutdown: %s", e)
        self.plane.live = False
        if not self.plane.runtime.tracer.close(timeout=10):
            log.warning("traces still being written at shutdown")
        self.plane.shm.close()
        if self._mirror_poll is not None:
            self._mirror_poll.kill()
        self.repository.stop(timeout=5)
        self.server_calls.uninstall()
        for mirror in self.mirrors:  # after the repository actor (its watcher) stopped looking at them
            mirror.close()
        if self.response_cache is not None:  # after the models: no answer is being stored any more
            self.response_cache.close()
        self._stopped.set()
        log.info("server stopped")

    def _sync_mirrors(self) -> None:
        """Bring every object-store mirror up to date (the caller's greenlet); raises TritonError."""
        for mirror in self.mirrors:
            mirror.sync()

    def run(self) -> int:
        """CLI entry: start, serve until SIGINT/SIGTERM, stop. Exit status 0 on a clean stop."""
        handlers: list[Any] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers.append(gevent.signal_handler(sig, lambda: gevent.spawn(self.stop)))
        try:
            self.start()
        except StartupError as e:
            log.error("%s; exiting (--exit-on-error=true)", e)
            self.stop()
            return 1
        except OSError as e:  # a port already taken: like Triton, exit with an error
            log.error("failed to start: %s", e)
            self.stop()
            return 1
        self._stopped.wait()
        for h in handlers:
            h.cancel()
        return 0

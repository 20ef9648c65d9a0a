"""One loaded model version: its instances and scheduler, started and stopped for a :class:`ModelActor`.

Runs in the model actor's greenlet or in helper greenlets it spawns and joins; a version record is
touched by one greenlet at a time. Loading never raises: a failure becomes the record's UNAVAILABLE
state and reason (a raise in a helper greenlet would be a greenlet crash with a traceback).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent

from ...backends.base import Backend, InstanceContext
from ...errors import TritonError
from ...metrics.latency import LatencyRecorder
from ...metrics.statistics import VersionStats
from ...observability.tracing import Tracer
from ...repository import layout
from ...repository.config import ModelConfig
from ...repository.ensemble_graph import Graph
from ...repository.public_paths import PublicPaths
from ...repository.snapshot import FileEntry
from ...runtime.kernel import Reply
from ...runtime.response_channel import OpenStreams
from ..scheduling.batch_queue import BatchPolicy
from ..scheduling.ensemble import EnsembleScheduler, Routes
from ..scheduling.instance import ModelInstance
from ..scheduling.pool_scheduler import Limited
from ..scheduling.rate_limiter import Needs, RateLimiter, Waiter
from ..scheduling.scheduler import Drain, SchedulerActor
from ..scheduling.sequence_controls import SequenceTensors
from ..scheduling.sequence_scheduler import SequenceSchedulerActor
from ..scheduling.sequence_slots import SlotPolicy
from .cached import CachedVersion
from .handles import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNKNOWN,
    CachedVersionHandle,
    ReadyState,
    VersionHandle,
    check_transition,
)
from .validation import RequestValidator
from .warmup import warm_up

log = logging.getLogger(__name__)
_KIND_NAMES = {0: "AUTO", 1: "GPU", 2: "CPU", 3: "MODEL"}


@dataclass(slots=True)
class Version:
    """A model actor's record of one version: a single-owner object (mutable, owned by the model actor,
    touched by one greenlet at a time). Its state changes only through :meth:`to`, which checks
    :data:`~.handles.TRANSITIONS`; a new record is born from UNKNOWN into ``state``."""

    version: int
    state: ReadyState
    reason: str = ""
    scheduler: SchedulerActor | SequenceSchedulerActor | None = None
    instances: list[ModelInstance] = field(default_factory=list)
    validator: RequestValidator | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)
    files: tuple[FileEntry, ...] = ()  # the version folder as it was when loaded (change detection)
    cache: CachedVersion | None = None  # the response cache's front, when the model and the server enable it

    def __post_init__(self) -> None:
        check_transition(UNKNOWN, self.state)

    def to(self, state: ReadyState, reason: str = "") -> None:
        """Move to ``state`` with ``reason``; an illegal transition raises INTERNAL (a bug of ours)."""
        self.state = check_transition(self.state, state)
        self.reason = reason

    def handle(self) -> VersionHandle:
        if self.cache is not None:
            return CachedVersionHandle(self.version, self.state, self.reason, self.scheduler, self.validator,
                                       self.labels, self.cache)
        return VersionHandle(self.version, self.state, self.reason, self.scheduler, self.validator, self.labels)

    @property
    def running(self) -> bool:
        return self.scheduler is not None or bool(self.instances)


@dataclass(frozen=True, slots=True)
class VersionSource:
    """Everything needed to start one version."""

    model: str
    version: int
    model_dir: Path
    version_dir: Path
    config: ModelConfig
    config_json: str
    backend: Backend | None  # None for an ensemble
    backend_config: dict[str, str]
    files: tuple[FileEntry, ...]
    workers: int = 1  # worker processes sharing the host: instance_group counts are per host (docs/deployment.md)
    graph: Graph | None = None  # an ensemble's checked graph
    routes: Routes | None = None  # the routing table an ensemble's steps are routed through
    # told when every instance is DOWN: on_down(version, scheduler, reason) (the model actor's event)
    on_down: Callable[[int, Any, str], None] | None = None
    tracer: Tracer | None = None  # the server's (LoadSettings.tracer): the scheduler's VersionTrace comes from it
    server_hooks: Any = None  # the server's pb_utils ServerHooks, for every instance (LoadSettings.server_hooks)
    rate_limiter: RateLimiter | None = None  # the server's (LoadSettings.rate_limiter); None: --rate-limit=off
    response_cache: Any = None  # the server's cache store (LoadSettings.response_cache); None: no --cache-config
    streams: OpenStreams | None = None  # the server's open channels (LoadSettings.streams), for an ensemble's steps
    public_paths: PublicPaths = ()  # what its errors name instead of the server's folders (ModelActor._public_paths)


def start_version(src: VersionSource, load_timeout_s: float,
                  latency_metrics: tuple[bool, bool] = (False, False), retries: int = 0) -> Version:
    """Create the instances (each on its own native thread), warm them up, start the scheduler; a
    failed start is tried again up to ``retries`` times (Triton's --model-load-retry-count: its model
    lifecycle creates the model again, with everything of the failed try closed)."""
    for attempt in range(retries + 1):
        rec = _start_once(src, load_timeout_s, latency_metrics)
        if rec.state == READY or attempt == retries:
            return rec
        log.info("retrying the load of '%s' version %d (retry %d of %d)", src.model, src.version, attempt + 1,
                 retries)
    return rec


def _start_once(src: VersionSource, load_timeout_s: float, latency_metrics: tuple[bool, bool]) -> Version:
    start = time.monotonic()
    rec = Version(src.version, LOADING, files=src.files)
    if src.graph is not None:
        return _start_ensemble(src, rec)
    instances: list[ModelInstance] = []
    waiters: list[Waiter | None] = []
    try:
        labels = _read_labels(src.config, src.model_dir, src.model)
        contexts = _contexts(src)
        waiters = _rate_limited(src, contexts)  # before any instance starts: resources that can never suffice fail here
        for ctx in contexts:  # one by one: if starting one fails, those started are closed below
            instances.append(ModelInstance(ctx, src.backend))
        failures: list[Exception] = []
        for inst in instances:
            try:
                inst.wait_ready(load_timeout_s)
            except Exception as e:  # noqa: BLE001 - collected, the first one is the version's reason
                failures.append(e)
        if failures:
            raise failures[0]
        warm_up(src.config, src.model_dir, src.model, src.version, instances)
        stats = VersionStats(src.model, src.version)
        stats.load_secs = time.monotonic() - start
        if any(latency_metrics):  # --metrics-config summary_latencies / histogram_latencies
            stats.latency_recorder = LatencyRecorder(*latency_metrics)
        limited = {inst: w for inst, w in zip(instances, waiters, strict=True) if w is not None}
        scheduler = _scheduler(src, instances, stats, (src.rate_limiter, limited) if limited else None)
        scheduler.start()
    except Exception as e:  # noqa: BLE001 - any load failure becomes the version's reason
        for inst in instances:
            inst.close(timeout=10)
        if src.rate_limiter is not None:
            src.rate_limiter.unregister([w for w in waiters if w is not None])
        reason = e.status_text() if isinstance(e, TritonError) else repr(e)
        log.error("failed to load '%s' version %d: %s", src.model, src.version, e)
        rec.to(UNAVAILABLE, reason)
        return rec
    log.info("successfully loaded '%s' version %d (%.2f s)", src.model, src.version, time.monotonic() - start)
    rec.scheduler, rec.instances, rec.validator, rec.labels = scheduler, instances, RequestValidator(src.config), labels
    rec.cache = _cache(src, stats, scheduler)
    rec.to(READY)
    return rec


def _rate_limited(src: VersionSource, contexts: list[InstanceContext]) -> list[Waiter | None]:
    """Each instance's place with the server's rate limiter (None: not limited), in ``contexts``' order;
    Triton's error when the resources could never let them run."""
    if src.rate_limiter is None:
        return [None] * len(contexts)
    needs = [Needs.of_group(group, device) for group, device, _ in _placements(src)]
    added = iter(src.rate_limiter.register([(n, ctx.instance_name) for n, ctx in zip(needs, contexts, strict=True)
                                            if n is not None]))
    return [next(added) if n is not None else None for n in needs]


def _scheduler(src: VersionSource, instances: list[ModelInstance], stats: VersionStats,
               limited: Limited | None = None) -> SchedulerActor | SequenceSchedulerActor:
    """The version's scheduler: the sequence batcher with ``sequence_batching``, else default / dynamic."""
    name = f"scheduler:{src.model}:{src.version}"
    cfg = src.config
    on_down = functools.partial(src.on_down, src.version) if src.on_down is not None else None
    if cfg.HasField("sequence_batching"):
        return SequenceSchedulerActor(name, src.model, instances, stats, SlotPolicy.from_config(cfg, len(instances)),
                                      SequenceTensors.from_config(cfg, src.model_dir),
                                      decoupled=cfg.model_transaction_policy.decoupled, on_down=on_down,
                                      limited=limited)
    return SchedulerActor(name, instances, stats, BatchPolicy.from_config(cfg),
                          trace=src.tracer.version(src.model, src.version) if src.tracer is not None else None,
                          on_down=on_down, limited=limited)


def _cache(src: VersionSource, stats: VersionStats, scheduler: Any) -> CachedVersion | None:
    """The cache front when the model enables ``response_cache`` and the server has a cache; a model that
    enables it on a server without one serves uncached, as Triton's does (its scheduler checks both)."""
    if src.response_cache is None or not src.config.response_cache.enable:
        return None
    return CachedVersion(src.response_cache, stats, src.model, src.version, scheduler)


def _start_ensemble(src: VersionSource, rec: Version) -> Version:
    """An ensemble version has no instances: its scheduler routes each step to the composing models."""
    assert src.graph is not None and src.routes is not None
    stats = VersionStats(src.model, src.version)
    max_inflight = src.config.ensemble_scheduling.max_inflight_requests
    if max_inflight > 0:  # Triton's log line (its L0_simple_ensemble looks for it)
        log.info("Ensemble model '%s' configured with max_inflight_requests: %d", src.model, max_inflight)
    scheduler = EnsembleScheduler(f"ensemble:{src.model}:{src.version}", src.graph, src.routes, stats, max_inflight,
                                  version=src.version, streams=src.streams)
    scheduler.start()
    log.info("successfully loaded '%s' version %d", src.model, src.version)
    rec.scheduler, rec.validator = scheduler, RequestValidator(src.config)  # type: ignore[assignment]
    rec.cache = _cache(src, stats, scheduler)
    rec.to(READY)
    return rec


def stop_version(rec: Version, model: str) -> None:
    """Wait until the version's queue is empty and nothing runs, finalize its instances, stop its scheduler.
    The first caller takes them (a drain behind a reload and a restart's cleanup may both reach a record)."""
    scheduler, instances = rec.scheduler, rec.instances
    if scheduler is None and not instances:
        return
    rec.scheduler, rec.instances = None, []
    if scheduler is not None:
        drained: Reply[None] = Reply()
        try:
            scheduler.ref.tell(Drain(drained))
            drained.get(timeout=None)
        except TritonError:
            pass  # stopped already
        scheduler.stop()
    for inst in instances:
        inst.close()
    log.info("successfully unloaded '%s' version %d", model, rec.version)


class Drains:
    """The versions a model actor stopped serving, drained and unloaded behind it in helper greenlets: a
    reload answers at the swap and its actor goes on with its mailbox, so an unload told meanwhile is not
    held for as long as the old version's slowest request (Triton unloads the old version in the background
    too); the next load that changes something waits for it (the actor's ``_update``), so old versions do not
    pile up. Single-owner (its model actor); the greenlets touch only the records they were given."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._running: set[gevent.Greenlet] = set()

    def start(self, records: list[Version], then: Callable[[], None]) -> None:
        """Stop ``records`` one after another (each drains first), then call ``then`` (a helper greenlet)."""
        def drain() -> None:
            for rec in records:
                try:
                    stop_version(rec, self.model)
                except Exception:  # a bug of ours: the others still go, and then runs
                    log.exception("model '%s': unloading version %d failed", self.model, rec.version)
            then()

        job = gevent.spawn(drain)
        self._running.add(job)
        job.rawlink(self._running.discard)

    def wait(self) -> None:
        """Until every drain started so far has ended (an unload's answer: the model is gone)."""
        gevent.joinall(list(self._running))

    def settled(self, reply: Reply[None]) -> None:
        """``reply`` completes once the drains started so far have ended (the memory budget's wait)."""
        running = list(self._running)
        if not running:
            reply.set(None)
            return
        gevent.spawn(lambda: (gevent.joinall(running), reply.set(None)))


def _placements(src: VersionSource) -> list[tuple[Any, int, int]]:
    """(instance group, device, index in the group) of each instance of the version, in order."""
    return [(group, device, i) for group in src.config.instance_group
            for device in (list(group.gpus) if group.kind == 1 else [0])
            for i in range(per_worker(group.count, src.workers))]


def _contexts(src: VersionSource) -> list[InstanceContext]:
    return [InstanceContext(src.model, src.version, src.model_dir, src.version_dir, src.config, src.config_json,
                            _instance_name(group.name, i), _KIND_NAMES.get(group.kind, "CPU"), device, n,
                            src.backend_config, src.server_hooks, src.public_paths)
            for n, (group, device, i) in enumerate(_placements(src))]


def per_worker(count: int, workers: int) -> int:
    """A group's ``count`` instances are the host's: each of ``workers`` processes runs its share, rounded
    up and at least one, so no worker is left without an instance of a model it serves."""
    return max(1, -(-count // max(1, workers)))


def _instance_name(group: str, index: int) -> str:
    """Triton 2.51 names instance ``c`` of group ``g`` ``<g>_<c>``, a lone one too (``m_0_0``, and ``m_0``
    for the group ``m`` it adds to a config without ``instance_group``). The copies of one instance on
    several GPUs share that name, as in Triton core's ``backend_model.cc``."""
    return f"{group}_{index}"


def _read_labels(config: ModelConfig, model_dir: Path, model: str) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    for out in config.output:
        if out.label_filename:
            path = model_dir / out.label_filename
            if not layout.contained(model_dir, path) or not path.is_file():
                raise TritonError.invalid_arg(
                    f"model '{model}': label file '{out.label_filename}' of output '{out.name}' not found in the model directory"
                )
            labels[out.name] = layout.read_labels(path)
    return labels

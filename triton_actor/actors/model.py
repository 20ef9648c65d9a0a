"""ModelActor: the versions of one model, their ready states, and loading / unloading them.

Messages: :class:`Load` (ask: read the config, load the versions its policy names; answers when
every version is READY or failed), :class:`Unload` (ask: drain and finalize every version).
State owned: the version records (state, reason, scheduler, instances) and the model's config.
It publishes an immutable :class:`ModelHandle` after every change through ``publish``; the front
ends route requests through the handle without a round trip to this actor.
Failure: a version that fails to load is UNAVAILABLE with the reason; the other versions serve.
Lifecycle operations on one model are serialized by this actor's mailbox.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gevent

from ..backends.base import Backend, InstanceContext
from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..repository import config as config_mod
from ..repository import layout
from ..repository.config import ModelConfig
from ..statistics import VersionStats
from ..validation import RequestValidator
from .batch_queue import BatchPolicy
from .bridge import call_in_thread
from .instance import InstanceActor
from .kernel import Actor, Reply
from .scheduler import Drain, Enqueue, GetStats, SchedulerActor

log = logging.getLogger(__name__)

UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE = "UNKNOWN", "LOADING", "READY", "UNLOADING", "UNAVAILABLE"
_KIND_NAMES = {0: "AUTO", 1: "GPU", 2: "CPU", 3: "MODEL"}


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """What the server tells every model actor about how to load."""

    auto_complete: bool = True
    config_name: str = ""
    gpu_count: int = 0
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    load_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class VersionHandle:
    """One version as the routing table shows it."""

    version: int
    state: str
    reason: str = ""
    scheduler: SchedulerActor | None = None
    validator: RequestValidator | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        """Validate and queue (caller's greenlet). The reply completes when the model answered."""
        assert self.validator is not None and self.scheduler is not None
        batch = self.validator.check(request)
        reply: Reply[InferResponse] = Reply()
        self.scheduler.ref.tell(Enqueue(request, batch, reply, time.perf_counter_ns()))
        return reply

    def statistics(self) -> dict[str, object]:
        assert self.scheduler is not None
        return self.scheduler.ref.ask(GetStats(), timeout=30)


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """Immutable snapshot of one model, swapped in by its actor on every change."""

    name: str
    config: ModelConfig | None
    versions: dict[int, VersionHandle]
    ready_versions: tuple[int, ...]  # ascending

    def resolve(self, version: int) -> VersionHandle:
        """The version that serves ``version`` (-1: highest READY), with Triton's errors (spec §1.2)."""
        if version < 0:
            if not self.ready_versions:
                raise TritonError.not_found(f"Request for unknown model: '{self.name}' has no available versions")
            return self.versions[self.ready_versions[-1]]
        handle = self.versions.get(version)
        if handle is None:
            raise TritonError.not_found(f"Request for unknown model: '{self.name}' version {version} is not found")
        if handle.state != READY:
            raise TritonError.unavailable(
                f"Request for unknown model: '{self.name}' version {version} is not at ready state"
            )
        return handle


@dataclass(frozen=True, slots=True)
class Load:
    model_dir: Path


@dataclass(frozen=True, slots=True)
class Unload:
    pass


@dataclass(slots=True)
class _Version:
    version: int
    state: str
    reason: str = ""
    scheduler: SchedulerActor | None = None
    instances: list[InstanceActor] = field(default_factory=list)
    validator: RequestValidator | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)


class ModelActor(Actor):
    """Owns the versions of one model."""

    def __init__(self, name: str, backends: dict[str, Backend], settings: LoadSettings,
                 publish: Callable[[ModelHandle], None], parent: Actor | None = None) -> None:
        super().__init__(f"model:{name}", parent)
        self.model = name
        self._backends = backends
        self._settings = settings
        self._publish = publish
        self._config: ModelConfig | None = None
        self._versions: dict[int, _Version] = {}

    # -- messages ---------------------------------------------------------------------------------
    def on_Load(self, msg: Load) -> None:
        try:
            config, backend, selected = self._prepare(msg.model_dir)
        except TritonError as e:
            self._fail_all(e.status_text())
            raise
        self._config = config
        for v in selected:
            self._versions[v] = _Version(v, LOADING)
        self._publish_now()
        config_json = json.dumps(config_mod.to_json_dict(config))
        jobs = [gevent.spawn(self._load_version, msg.model_dir, v, path, config, config_json, backend)
                for v, path in selected.items()]
        gevent.joinall(jobs)
        errors = [str(job.value) for job in jobs if job.value is not None]
        self._publish_now()
        if errors:
            raise TritonError.invalid_arg("; ".join(errors))

    def on_Unload(self, _msg: Unload) -> None:
        for rec in self._versions.values():
            if rec.state == READY:
                rec.state = UNLOADING
        self._publish_now()
        for rec in list(self._versions.values()):
            if rec.scheduler is not None or rec.instances:
                self._stop_version(rec)
            rec.state, rec.reason = UNAVAILABLE, "unloaded"
        self._publish_now()

    # -- loading ----------------------------------------------------------------------------------
    def _prepare(self, model_dir: Path) -> tuple[ModelConfig, Backend, dict[int, Path]]:
        s = self._settings
        cfg, explicit = config_mod.read(model_dir, self.model, auto_complete=s.auto_complete,
                                        config_name=s.config_name)
        available = layout.list_versions(model_dir)
        first = available[min(available, key=str)] if available else None
        config_mod.fill_backend_fields(cfg, self.model, first)
        backend = self._backends.get(cfg.backend)
        if backend is None:
            raise TritonError.invalid_arg(
                f"model '{self.model}': unable to find backend '{cfg.backend}' "
                f"(available: {', '.join(sorted(self._backends))})"
            )
        if s.auto_complete:
            call_in_thread(backend.auto_complete, cfg, model_dir, first, explicit)
        config_mod.normalize(cfg, self.model, s.gpu_count)
        config_mod.validate(cfg, self.model, s.gpu_count)
        policy = cfg.version_policy.WhichOneof("policy_choice")
        arg: object = 0
        if policy == "latest":
            arg = cfg.version_policy.latest.num_versions
        elif policy == "specific":
            arg = list(cfg.version_policy.specific.versions)
        selected = layout.select_versions(policy or "latest", arg, available)  # type: ignore[arg-type]
        if not selected:
            raise TritonError.invalid_arg(
                f"at least one version must be available under the version policy of model '{self.model}'"
            )
        return cfg, backend, {v: available[v] for v in selected}

    def _load_version(self, model_dir: Path, version: int, version_dir: Path, config: ModelConfig,
                      config_json: str, backend: Backend) -> Exception | None:
        """Runs in a helper greenlet spawned by on_Load; only it touches this version record meanwhile.
        Returns the load error (None on success) rather than raising: a raise would be a greenlet crash."""
        rec = self._versions[version]
        start = time.monotonic()
        instances: list[InstanceActor] = []
        try:
            labels = _read_labels(config, model_dir, self.model)
            index = 0
            for group in config.instance_group:
                devices = list(group.gpus) if group.kind == 1 else [0]
                for device in devices:
                    for i in range(group.count):
                        ctx = InstanceContext(
                            self.model, version, model_dir, version_dir, config, config_json,
                            _instance_name(group.name, i, group.count, device, len(devices)),
                            _KIND_NAMES.get(group.kind, "CPU"), device, index,
                            self._settings.backend_config.get(config.backend, {}),
                        )
                        instances.append(InstanceActor(ctx, backend))
                        index += 1
            failures: list[Exception] = []
            for inst in instances:
                try:
                    inst.wait_ready(self._settings.load_timeout_s)
                except Exception as e:  # noqa: BLE001 - collected, the first one is the version's reason
                    failures.append(e)
            if failures:
                raise failures[0]
            stats = VersionStats(self.model, version)
            scheduler = SchedulerActor(f"scheduler:{self.model}:{version}", instances, stats,
                                       BatchPolicy.from_config(config))
            scheduler.start()
        except Exception as e:  # noqa: BLE001 - any load failure becomes the version's reason
            for inst in instances:
                inst.close(timeout=10)
            rec.state, rec.reason = UNAVAILABLE, e.status_text() if isinstance(e, TritonError) else repr(e)
            log.error("failed to load '%s' version %d: %s", self.model, version, e)
            return e
        rec.state, rec.reason = READY, ""
        rec.scheduler, rec.instances, rec.labels = scheduler, instances, labels
        rec.validator = RequestValidator(config)
        log.info("successfully loaded '%s' version %d (%.2f s)", self.model, version, time.monotonic() - start)
        return None

    def _stop_version(self, rec: _Version) -> None:
        """Drain the version's queue, finalize its instances, stop its scheduler."""
        if rec.scheduler is not None:
            drained: Reply[None] = Reply()
            rec.scheduler.ref.tell(Drain(drained))
            try:
                drained.get(timeout=None)
            except TritonError:
                pass
            rec.scheduler.stop()
        for inst in rec.instances:
            inst.close()
        rec.scheduler, rec.instances = None, []
        log.info("successfully unloaded '%s' version %d", self.model, rec.version)

    def _fail_all(self, reason: str) -> None:
        if not self._versions:
            self._versions[-1] = _Version(-1, UNAVAILABLE, reason)
        for rec in self._versions.values():
            if rec.state != READY:
                rec.state, rec.reason = UNAVAILABLE, reason
        self._publish_now()

    def _publish_now(self) -> None:
        versions = {
            v: VersionHandle(v, r.state, r.reason, r.scheduler, r.validator, r.labels)
            for v, r in sorted(self._versions.items())
        }
        ready = tuple(v for v, h in versions.items() if h.state == READY)
        self._publish(ModelHandle(self.model, self._config, versions, ready))

    def on_stop(self) -> None:
        for rec in self._versions.values():
            if rec.scheduler is not None or rec.instances:
                self._stop_version(rec)


def _instance_name(group: str, index: int, count: int, device: int, devices: int) -> str:
    """Triton names a lone instance after its group, otherwise ``<group>_<index>`` (GPU: ``_gpu<id>``)."""
    name = group if count == 1 else f"{group}_{index}"
    return name if devices <= 1 else f"{name}_gpu{device}"


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

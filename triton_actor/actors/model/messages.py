"""What a :class:`~.actor.ModelActor` is told, and how: its messages (:class:`Load`, :class:`Unload`,
:class:`Restart`, :class:`VersionDown`, :class:`MarkDown`, :class:`Settle`; their meaning is on the actor), the
:class:`Handover` a failed actor leaves to its replacement, the server's :class:`LoadSettings`, and
:class:`ModelRef`, the actor's typed facade.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backends.devices import runtime_gpu_support
from ...errors import TritonError
from ...observability.tracing import Tracer
from ...repository import snapshot
from ...repository.config import ModelConfig
from ...repository.public_paths import PublicPaths
from ...runtime.kernel import ActorRef, Reply
from ...runtime.response_channel import OpenStreams
from ..scheduling.rate_limiter import RateLimiter
from .handles import READY
from .version import Version

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """What the server tells every model actor about how to load."""

    auto_complete: bool = True
    config_name: str = ""
    gpu_count: int = 0
    # None when a backend's runtime can use a GPU, else why not: the model actor hands it to the config
    # checks, so the repository's files need not import the backends
    gpu_support: Callable[[str], str | None] = runtime_gpu_support
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    load_timeout_s: float = 600.0
    latency_metrics: tuple[bool, bool] = (False, False)  # (summary_latencies, histogram_latencies)
    workers: int = 1  # worker processes on this host (instance counts are divided among them)
    load_retries: int = 0  # --model-load-retry-count: a version whose load fails is started again this often
    tracer: Tracer | None = None  # the server's (observability/tracing.py); None: versions are not traced
    # what the server gives its Python models (pb_utils ``serving.ServerHooks``: BLS, model control, custom
    # metrics), handed to every instance; None: the process's only server, if any
    server_hooks: Any = None
    # the server's rate limiter (--rate-limit=execution_count, actors/scheduling/rate_limiter.py); None: off
    rate_limiter: RateLimiter | None = None
    # the server's response cache store (cache/: local or redis), None without --cache-config; each version
    # whose config enables response_cache answers through it (actors/model/cached.py)
    response_cache: Any = None
    # the server's open response channels (runtime/response_channel.py): an ensemble's decoupled steps
    # count there, for /status.json's streams; None: uncounted
    streams: OpenStreams | None = None
    # the local copies of object-store repositories and their URLs: what a client reads instead of the
    # copy's path in an error (repository/public_paths.py)
    public_paths: PublicPaths = ()


@dataclass(frozen=True, slots=True)
class Load:
    model_dir: Path
    config: ModelConfig | None = None  # load-API override, used instead of config.pbtxt (always reloads)
    owned: bool = False  # model_dir is a private temporary directory this actor deletes when done with it
    reply: Reply[None] | None = None  # None: told by POLL, nobody waits; failures are logged
    reload: bool = False  # load every selected version again even if nothing changed (after a restart)


@dataclass(frozen=True, slots=True)
class Unload:
    reply: Reply[None]
    stopping: Reply[None] | None = None  # set once no new request reaches the model (UNLOADING published)


@dataclass(frozen=True, slots=True)
class Settle:
    """Answered once the versions replaced by the reloads so far have drained and unloaded (a reload
    answers at the swap; the memory budget counts the old versions until then)."""

    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class _Drained:
    """From a reload's drain (helper greenlet): its replaced versions are gone; ``old_dir``, the override
    folder they were loaded from, may go."""

    records: list[Version]
    old_dir: Path | None


@dataclass(frozen=True, slots=True)
class Handover:
    """What a failed ModelActor leaves to its replacement (its state, owned from then on by the new one)."""

    versions: dict[int, Version]
    config: ModelConfig | None
    source: tuple[Path, snapshot.Stamp] | None
    owned_dir: Path | None
    serving: Load | None  # the load whose result serves (replayed by the restart)


@dataclass(frozen=True, slots=True)
class Restart:
    """From the supervisor: adopt the failed actor's state once ``handover`` completes; reload what was
    serving, or (``give_up`` set: past the restart budget) mark every version UNAVAILABLE and unload."""

    handover: Reply[Handover]
    error: str
    give_up: str | None = None


@dataclass(frozen=True, slots=True)
class VersionDown:
    """From a version's scheduler: none of its instances can serve any more (past their restart budget)."""

    version: int
    scheduler: object  # the scheduler that said it: an event of a version replaced since is stale
    reason: str


@dataclass(frozen=True, slots=True)
class MarkDown:
    """From the host: version ``version`` lost its instances with ``reason`` in a worker process. ``here``:
    this worker is that one (its reply fails when the version was loaded again since, so the host stops
    the broadcast); else the version turns UNAVAILABLE here if it is the same load: ``files`` (a
    :meth:`~...repository.snapshot.Stamp.digest`, "" to skip the check) equal to this worker's. The reply
    completes with whether it changed anything, once the routing table shows it."""

    version: int
    reason: str
    files: str
    here: bool
    reply: Reply[bool]


class ModelRef(ActorRef):
    """Typed facade of a :class:`ModelActor`."""

    __slots__ = ()

    def load(self, model_dir: Path, config: ModelConfig | None = None, owned: bool = False,
             reply: Reply[None] | None = None) -> Reply[None]:
        """Load (or reload) from ``model_dir``; the reply (``reply`` if given) completes when done."""
        done: Reply[None] = Reply() if reply is None else reply
        self.tell(Load(model_dir, config, owned, done))
        return done

    def unload(self, stopping: Reply[None] | None = None) -> Reply[None]:
        """Drain and finalize every version; the reply completes when they are gone (``stopping``, when
        given, as soon as no new request reaches the model)."""
        done: Reply[None] = Reply()
        self.tell(Unload(done, stopping))
        return done

    def settled(self, reply: Reply[None]) -> None:
        """See :class:`Settle`."""
        self.tell(Settle(reply))

    def mark_down(self, version: int, reason: str, files: str, here: bool, reply: Reply[bool]) -> None:
        """See :class:`MarkDown`; ``reply`` completes once the routing table shows it."""
        self.tell(MarkDown(version, reason, files, here, reply))


class LoadRefused(TritonError):
    """A load refused before any version ran, with the stage of Triton's load it fails at (core's
    ``model_repository_manager.cc``), which words the load API's answer (``load_api_error``). Its message
    is the bare reason: startup logs it, as Triton's log does.

    ``poll``: the config alone (its checks, the backend it names); Triton fails the poll:
    500 ``failed to load 'm', failed to poll from model repository``.
    ``model``: an ensemble against its composing models; 400 ``load failed for model 'm': <reason>\\n``.
    ``version``: the backend (none by that name, ``auto_complete_config``); each selected version
    fails: 400 ``load failed for model 'm': version N is at UNAVAILABLE state: <status>;\\n``."""

    __slots__ = ("stage", "versions")

    def __init__(self, error: TritonError, stage: str, versions: tuple[int, ...] = ()) -> None:
        super().__init__(error.code, error.message)
        self.stage = stage
        self.versions = versions


def load_api_error(name: str, error: BaseException) -> BaseException:
    """What the load API answers for a load of ``name`` that failed with ``error``, as Triton words it
    (measured on Triton 2.51 with the qa/L0_model_config repositories, scripts/triton_reference/
    l0_model_config.py --load-api). A poll failure keeps its reason after Triton's text (Triton only
    logs it; its own tests look for the text with assertIn, and its suite asks for the reason: a FIXME
    in L0_lifecycle)."""
    if not isinstance(error, LoadRefused):
        return error
    if error.stage == "poll":
        return TritonError.internal(f"failed to load '{name}', failed to poll from model repository: {error.message}")
    if error.stage == "model" or not error.versions:
        return TritonError.invalid_arg(f"load failed for model '{name}': {error.message}\n")
    failed = "".join(f"version {v} is at UNAVAILABLE state: {error.status_text()};\n" for v in error.versions)
    return TritonError.invalid_arg(f"load failed for model '{name}': {failed}")


def answer_load(name: str, reply: Reply[None], done: Reply[Any]) -> None:
    """Complete the load API's ``reply`` from the model actor's ``done``. A load refused before any version
    ran is logged as Triton logs it: for a poll failure its answer has only Triton's fixed text (ours appends
    the reason), its log the reason (``Poll failed for model directory 'm': Invalid config override: ...``,
    which Triton's L0_grpc and L0_http look for). A version's own failure is logged by the version."""
    error = done.exception()
    if error is None:
        reply.set(None)
        return
    if isinstance(error, LoadRefused):
        if error.stage == "poll":
            log.error("Poll failed for model directory '%s': %s", name, error.message)
        else:
            log.error("failed to load '%s': %s", name, error.message)
    reply.fail(load_api_error(name, error))


def failure_text(model: str, versions: dict[int, Version]) -> str:
    """Triton's load error: ``load failed for model 'm': version 1 is at UNAVAILABLE state: <reason>;\\n``."""
    failed = "".join(f"version {v} is at {rec.state} state: {rec.reason};\n"
                     for v, rec in sorted(versions.items()) if rec.state != READY)
    return f"load failed for model '{model}': {failed}"


def raise_failures(model: str, versions: dict[int, Version]) -> None:
    if any(rec.state != READY for rec in versions.values()):
        raise TritonError.invalid_arg(failure_text(model, versions))

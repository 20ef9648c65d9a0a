"""RepositoryActor: the model repositories on disk, the control mode, the model actors, the routing table.

Messages (through :class:`RepositoryRef`): :class:`LoadAll` (at startup: what the mode loads; its
reply completes with model → error once every load finished), :class:`LoadModel` / :class:`UnloadModel`
(the load API, only in EXPLICIT mode: the LoadModel reply is handed to the model actor, which completes
it when the load finished; the UnloadModel reply completes once the unload started),
:class:`Rescan` (tell: POLL reconciliation), :class:`ModelChanged` (event from a model actor carrying
its new handle), :class:`MarkVersionDown` (from the host: a version lost its instances in a worker
process; handed to that model's actor), :class:`Index` (ask), :class:`UnloadAll` (reply completes when
every model is gone), :class:`Settled` (handed to that model's actor: completes once it did what it was told),
:class:`~...runtime.kernel.ChildFailed` (a ModelActor failed in a tell).
State owned: repository paths, control mode, model actors, the POLL bookkeeping
(:class:`~...repository.reconcile.Reconciler`), and the routing table ``routes`` (name →
:class:`ModelHandle`), an immutable mapping replaced on every change, so front ends read it with no
round trip. Failure: a model that fails to load is UNAVAILABLE with its reason in the index (or keeps
serving its previous version); the others serve. Supervision: a ModelActor that fails in a tell (an
error that is not a TritonError, i.e. a bug or a backend breaking its contract) is replaced by a new
one that reloads what was serving, while the old routing snapshot keeps serving, at most
:data:`~...runtime.supervisor.MAX_RESTARTS` times in :data:`~...runtime.supervisor.RESTART_WINDOW_S`; the next failure
gives up: every version of that model UNAVAILABLE with the reason in the index and unloaded (a later
load API call or POLL change loads it afresh).

Ensembles (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_management.md): every batch of loads (startup, POLL changes, the load API) starts an ensemble's
load only once the loads of its composing models in the same batch finished (:meth:`_load_in_order`,
helper greenlets of :mod:`.load_order`); ensembles that contain each other fail at once with Triton's
text. In EXPLICIT mode loading an ensemble loads what it needs first, and ``unload_dependents`` unloads
what was loaded only for it (:class:`~...repository.dependencies.Dependencies`, owned here).

POLL is reconciliation (docs/architecture.md, "Lifecycle"): each rescan (``--repository-poll-secs``, or
a :mod:`.watcher` nudge) feeds the stamps on disk to the reconciler and carries out the loads and unloads it
answers, once a folder was quiet for ``SETTLE_S``; on demand, only for the loaded models (docs/repository.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import gevent
import gevent.lock

from ...backends.base import Backend
from ...errors import TritonError
from ...repository import layout, overrides, snapshot
from ...repository.config import ModelConfig
from ...repository.dependencies import Dependencies, read_deps
from ...repository.ensemble_graph import dependencies
from ...repository.reconcile import Reconciler
from ...runtime import gc_settle
from ...runtime.bridge import call_in_thread
from ...runtime.kernel import Actor, Reply
from ...runtime.supervisor import RestartBudget
from ..model.actor import Announce, ModelActor
from ..model.handles import READY, UNAVAILABLE, ModelHandle, VersionHandle, index_entries
from ..model.messages import LoadRefused, LoadSettings, Restart, answer_load
from .load_order import Start, loader, start_after, unload_after
from .messages import (
    Index,
    LoadAll,
    LoadModel,
    MarkVersionDown,
    ModelChanged,
    RepositoryRef,
    Rescan,
    Settled,
    UnloadAll,
    UnloadModel,
    _LoadsFinished,
    _ModelGone,
    _Refreshed,
    _UnloadsFinished,
)
from .watcher import Watcher

log = logging.getLogger(__name__)
NONE, POLL, EXPLICIT = "none", "poll", "explicit"
SETTLE_S = 1.0  # a changed model directory must stay unchanged this long before POLL loads it
_REFUSED = "explicit model load / unload is not allowed if polling is enabled"  # same text in NONE mode (spec #3)
_INVALID_NAME = "a model name is one folder name inside a model repository (no '/', no '..', not hidden)"


T = TypeVar("T")
_ON_HUB = 64 * 1024  # a load request's config or files up to this size are handled on the hub


def _off_hub_if_big(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a native thread when it handles more than :data:`_ON_HUB` bytes: protobuf's
    JSON parser reads a config at ~5 MB/s (a 64 MiB override would hold the hub 12 s), and writing
    file overrides is blocking file I/O. This actor's greenlet waits; the hub serves the others."""
    return call_in_thread(fn, *args) if size > _ON_HUB else fn(*args)




class RepositoryActor(Actor):
    """Owns what is on disk and which model actors exist, and supervises the model actors."""

    ref_class = RepositoryRef
    ref: RepositoryRef

    def __init__(self, repositories: list[Path], backends: dict[str, Backend], settings: LoadSettings,
                 control_mode: str = NONE, startup_models: tuple[str, ...] = (), poll_secs: float = 15.0,
                 load_threads: int = 4, restarts: RestartBudget | None = None, on_demand: bool = False,
                 refresh: Callable[[], object] | None = None, announce: Announce | None = None) -> None:
        super().__init__("repository")
        self._announce = announce  # the model actors' word that a version lost its instances (host/handlers.py)
        self._refresh = refresh  # re-syncs object-store mirrors (repository/remote.py) before a load
        self._restarts = restarts or RestartBudget()
        self.repositories = repositories
        self.control_mode = control_mode
        self._startup_models = startup_models
        self._poll_secs = poll_secs
        self._backends = backends
        self._settings = settings
        self._gate = gevent.lock.Semaphore(max(1, load_threads))
        self._models: dict[str, ModelActor] = {}
        self._on_demand = on_demand  # --model-load-on-demand: requests load models, evictions unload them
        self._poll = Reconciler(SETTLE_S, loaded_only=on_demand)  # POLL: what was loaded from which files
        self._graph = Dependencies()  # which ensemble needs which model; what was loaded only as a dependency
        self._rescan_due: gevent.Greenlet | None = None
        self._timer: gevent.Greenlet | None = None
        self._watcher: Watcher | None = None
        self.routes: MappingProxyType[str, ModelHandle] = MappingProxyType({})

    def on_start(self) -> None:
        if self.control_mode == POLL:
            if self._poll_secs > 0:
                self._timer = gevent.spawn(self._tick)
            self._watcher = Watcher(self.repositories, self.nudge)

    def on_stop(self) -> None:
        for g in (self._timer, self._rescan_due):
            if g is not None:
                g.kill(block=False)
        if self._watcher is not None:
            self._watcher.stop()

    # -- startup ----------------------------------------------------------------------------------
    def on_LoadAll(self, msg: LoadAll) -> None:
        """Start the loads the mode asks for, in parallel; the answer (model → error) comes via _LoadsFinished."""
        found = layout.list_models(self.repositories)
        names = list(found)
        failures: dict[str, str] = {}
        named = self.control_mode == EXPLICIT or (self.control_mode == POLL and self._on_demand)
        if named:
            names = names if self._startup_models == ("*",) else list(self._startup_models)
        if named:  # --load-model of an ensemble loads its composing models too
            wanted = set(names)
            names = list(dict.fromkeys(n for name in names for n in self._graph.closure(name, self._disk_deps(found))))
            self._graph.implicit.update(n for n in names if n not in wanted)
        starts: dict[str, Start] = {}
        for name in names:
            try:
                model_dir = self._model_dir(name, found)
            except TritonError as e:
                failures[name] = e.status_text()
                continue
            if self.control_mode == POLL:
                self._poll.loaded(name, snapshot.take(model_dir))
            self._graph.set(name, read_deps(name, model_dir, self._settings.config_name))
            starts[name] = loader(model_dir)
        pending = self._load_in_order(starts)
        gevent.spawn(self._await_loads, pending, failures, msg.reply)

    def _await_loads(self, pending: dict[str, Reply[None]], failures: dict[str, str], reply: Reply[dict[str, str]]) -> None:
        """Helper greenlet: wait for the loads, then report back through the mailbox (keeps ordering)."""
        for name, r in pending.items():
            try:
                r.get()
            except Exception as e:  # noqa: BLE001
                # logged at startup with the code as Triton's log shows it ("Invalid argument: ...")
                failures[name] = e.status_text() if isinstance(e, TritonError) else str(e)
        self.ref.tell(_LoadsFinished(reply, failures))

    def on__LoadsFinished(self, msg: _LoadsFinished) -> None:
        msg.reply.set(msg.failures)

    # -- the load API (EXPLICIT) ------------------------------------------------------------------
    def on_LoadModel(self, msg: LoadModel) -> None:
        """Hands ``msg.reply`` to the model actor, which completes it when the load finished.

        What fails before a load starts (unknown or invalid name, bad overrides) is Triton's 500
        ``failed to load 'm', failed to poll from model repository``, with the reason appended (Triton
        only logs it; scripts/triton_reference/NOTES.md, pass 4)."""
        if not self._may_change(msg.demand):
            raise TritonError.unavailable(_REFUSED)
        if self._refresh is not None:  # Triton polls the repository on every load: sync the mirrors first
            gevent.spawn(self._refresh_for, msg)
            return
        self._start_load(msg)

    def _refresh_for(self, msg: LoadModel) -> None:
        """Helper greenlet: sync the object-store mirrors (network I/O stays off the mailbox), then load."""
        error = None
        try:
            self._refresh()  # type: ignore[misc]
        except TritonError as e:
            error = e
        self._tell(_Refreshed(msg, msg.reply, error))

    def on__Refreshed(self, msg: _Refreshed) -> None:
        if msg.error is not None:
            log.error("Poll failed for model directory '%s': %s", msg.load.name, msg.error.message)  # as Triton
            raise TritonError.internal(f"{_poll_failed(msg.load.name)}: {msg.error.message}")
        self._start_load(msg.load)

    def _start_load(self, msg: LoadModel) -> None:
        try:
            model_dir, override, owned = self._load_request(msg)
        except TritonError as e:
            reason = "" if e.message == _poll_failed(msg.name) else f": {e.message}"
            log.error("Poll failed for model directory '%s'%s", msg.name, reason or ": not in the repository")
            raise TritonError.internal(_poll_failed(msg.name) + reason) from None
        disk = self._disk_deps(layout.list_models(self.repositories))

        def lookup(name: str) -> tuple[str, ...] | None:
            if name != msg.name:
                return disk(name)
            return dependencies(override) if override is not None else read_deps(name, model_dir, self._settings.config_name)

        order = self._graph.closure(msg.name, lookup)
        self._graph.implicit.discard(msg.name)
        starts: dict[str, Start] = {}
        found = layout.list_models(self.repositories)
        for name in order[:-1]:  # the composing models it needs (an ensemble's), loaded first
            if len(found.get(name, ())) != 1:
                continue  # not in the repository: the ensemble's own check says so
            handle = self.routes.get(name)
            if handle is None or not handle.ready_versions:
                self._graph.implicit.add(name)  # Triton: "not explicitly loaded"
            starts[name] = loader(found[name][0])
        starts[msg.name] = loader(model_dir, override, owned)
        for name in starts if self.control_mode == POLL else ():  # a demand load: rescans follow it from now on
            self._poll.loaded(name, snapshot.take(found[name][0] if name != msg.name else model_dir))
        done = self._load_in_order(starts)
        reply, name = msg.reply, msg.name  # not msg (its config text); Triton's words for a refusal
        done[name].link(partial(answer_load, name, reply))

    def _load_request(self, msg: LoadModel) -> tuple[Path, ModelConfig | None, bool]:
        """Where the model actor loads from: the model's folder, or a private copy with the overrides."""
        if not layout.is_valid_model_name(msg.name):
            raise TritonError.invalid_arg(_INVALID_NAME)
        model_dir = self._model_dir(msg.name, layout.list_models(self.repositories))
        override = None if msg.config is None else _off_hub_if_big(
            len(msg.config), overrides.parse_config, msg.name, msg.config)  # a holder: the parse takes its text
        if msg.files and override is None:
            raise TritonError.invalid_arg("file overrides need a 'config' parameter as well")
        if msg.files:
            size = sum(len(f) for f in msg.files.values())
            return _off_hub_if_big(size, overrides.materialize, msg.name, msg.files), override, True
        return model_dir, override, False

    def on_UnloadModel(self, msg: UnloadModel) -> None:
        """Returns before the model is gone (Triton: unload is asynchronous, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md); an
        unknown model (or a name that cannot be one) is not an error. ``unload_dependents``: the models
        loaded only because this ensemble needed them, and needed by no other loaded model, are
        unloaded once it is gone."""
        if not self._may_change(msg.demand):
            raise TritonError.unavailable(_REFUSED)
        if self.control_mode == POLL:
            self._poll.forget(msg.name)  # evicted: a rescan neither reloads nor unloads it again
        actor = self._models.get(msg.name)
        if actor is not None:
            # answered once the model is UNLOADING (not ready, no new request reaches it), as Triton's
            # unload: asynchronous, but a readiness check right after it says not ready
            stopping: Reply[None] = Reply()
            done = actor.ref.unload(stopping)
            done.link(lambda r: r.exception() and log.error("unloading '%s' failed: %s", msg.name, r.exception()))
            for event in (done,) if msg.finished else (stopping, done):  # done: also an unload that failed early
                event.link(lambda _r: msg.reply.ready() or msg.reply.set(None))
            if msg.unload_dependents:
                loaded = [n for n, h in self.routes.items() if h.ready_versions]
                deps = [(n, self._models[n].ref) for n in self._graph.to_unload(msg.name, loaded) if n in self._models]
                self._graph.implicit.difference_update(n for n, _ in deps)
                gevent.spawn(unload_after, done, deps)
            return
        msg.reply.set(None)

    def _may_change(self, demand: bool) -> bool:
        """The load and unload APIs are EXPLICIT's; on demand, POLL loads and evicts too."""
        return self.control_mode == EXPLICIT or (demand and self._on_demand and self.control_mode == POLL)

    def _model_dir(self, name: str, found: dict[str, list[Path]]) -> Path:
        dirs = found.get(name) if layout.is_valid_model_name(name) else None
        if not dirs:
            raise TritonError.internal(_poll_failed(name))
        if len(dirs) > 1:
            self._set_route(ModelHandle(name, None, {}, ()))
            raise TritonError.invalid_arg(
                f"model '{name}' appears in more than one repository: {', '.join(map(str, dirs))}")
        return dirs[0]

    # -- POLL -------------------------------------------------------------------------------------
    def nudge(self) -> None:
        """Something changed on disk (hub thread, from the watcher): rescan soon, once."""
        if self._rescan_due is None or self._rescan_due.dead:
            self._rescan_due = gevent.spawn_later(0.05, self._tell_rescan)

    def _tell_rescan(self) -> None:
        self._tell(Rescan())

    def _tick(self) -> None:
        while True:
            gevent.sleep(self._poll_secs)
            self._tell_rescan()

    def on_Rescan(self, _msg: Rescan) -> None:
        found = layout.list_models(self.repositories)
        unique = {name: dirs[0] for name, dirs in found.items() if len(dirs) == 1}
        actions = self._poll.step({name: snapshot.take(d) for name, d in unique.items()}, time.monotonic())
        starts: dict[str, Start] = {}
        for name in actions.load:
            log.info("poll: loading '%s' (files changed)", name)
            self._graph.set(name, read_deps(name, unique[name], self._settings.config_name))
            starts[name] = loader(unique[name])
        for name, done in self._load_in_order(starts).items():  # a failure is logged, and in the index
            done.link(lambda r, name=name: r.exception() and log.error("loading '%s' failed: %s", name, r.exception()))
        for name in actions.unload:
            log.info("poll: unloading '%s' (its folder is gone)", name)
            self._models[name].ref.unload().link(lambda _r, name=name: self._tell(_ModelGone(name)))
        if actions.settling and (self._rescan_due is None or self._rescan_due.dead):
            self._rescan_due = gevent.spawn_later(SETTLE_S, self._tell_rescan)

    def on__ModelGone(self, msg: _ModelGone) -> None:
        """A model whose folder was removed is unloaded: it leaves the index, as in Triton (NOTES.md pass 4),
        unless its folder came back meanwhile."""
        if msg.name in self._poll.applied:
            return
        actor = self._models.pop(msg.name, None)
        if actor is not None:
            actor.stop(timeout=0)
        routes = dict(self.routes)
        routes.pop(msg.name, None)
        self.routes = MappingProxyType(routes)
        gc_settle.soon()

    def _tell(self, message: object) -> None:
        try:
            self.ref.tell(message)
        except TritonError:
            pass  # stopped meanwhile

    # -- routing and index ------------------------------------------------------------------------
    def on_ModelChanged(self, msg: ModelChanged) -> None:
        self._set_route(msg.handle)
        gc_settle.soon()  # loaded or unloaded: the collector's long-lived objects changed (runtime/gc_settle.py)
        if msg.applied is not None:
            msg.applied.set(None)

    def on_MarkVersionDown(self, msg: MarkVersionDown) -> None:
        actor = self._models.get(msg.name)
        if actor is None:
            if msg.here:
                raise TritonError.unavailable(f"model '{msg.name}' is gone")  # fails msg.reply
            msg.reply.set(False)
            return
        actor.ref.mark_down(msg.version, msg.reason, msg.files if self.control_mode == POLL else "", msg.here,
                            msg.reply)

    def on_Settled(self, msg: Settled) -> None:
        actor = self._models.get(msg.name)
        if actor is None:
            msg.reply.set(None)
        else:
            actor.ref.settled(msg.reply)  # (a stopped actor fails it: nothing of it is left to wait for)

    def on_Index(self, msg: Index) -> list[dict[str, Any]]:
        names = set(layout.list_models(self.repositories)) | set(self.routes)
        return index_entries(sorted(names), self.routes, msg.ready_only)

    def on_UnloadAll(self, msg: UnloadAll) -> None:
        replies = [actor.ref.unload() for actor in self._models.values()]

        def wait() -> None:
            """Helper greenlet: wait for the unloads, then finish in the mailbox (the actors are ours)."""
            for r in replies:
                try:
                    r.get()
                except Exception as e:  # noqa: BLE001
                    log.error("unload failed: %s", e)
            self._tell(_UnloadsFinished(msg.reply))

        gevent.spawn(wait)

    def on__UnloadsFinished(self, msg: _UnloadsFinished) -> None:
        for actor in self._models.values():
            actor.stop()
        msg.reply.set(None)

    # -- supervision ------------------------------------------------------------------------------
    def on_child_failure(self, child: Actor, error: BaseException) -> None:
        """A ModelActor failed in a tell: restart it within the budget, else give up on the model.
        Either way the failed actor hands its state to a replacement, which reloads (or unloads)."""
        if not isinstance(child, ModelActor) or self._models.get(child.model) is not child:
            super().on_child_failure(child, error)  # not one of ours any more: just stop it
            return
        name = child.model
        text = error.status_text() if isinstance(error, TritonError) else repr(error)
        give_up = None
        if self._restarts.allow(name):
            log.error("model actor '%s' failed: %s; restarting it (%d of %d in %.0f s)", name, text,
                      self._restarts.used(name), self._restarts.max_restarts, self._restarts.window_s,
                      exc_info=error)
        else:
            give_up = (f"the model's actor failed more than {self._restarts.max_restarts} times in "
                       f"{self._restarts.window_s:.0f} s, last: {text}")
            log.error("model actor '%s' failed: %s; giving up, the model is UNAVAILABLE", name, text, exc_info=error)
        handover = child.hand_over()
        del self._models[name]
        self._actor_for(name).ref.tell(Restart(handover, text, give_up))

    # -- load order (ensembles after their composing models) ---------------------------------------
    def _load_in_order(self, starts: dict[str, Start]) -> dict[str, Reply[None]]:
        """Start every load of ``starts``; one whose model needs others of ``starts`` (an ensemble) starts
        once theirs finished, in a helper greenlet. An ensemble that contains itself fails at once.
        Returns name → reply of its load."""
        done: dict[str, Reply[None]] = {name: Reply() for name in starts}
        for name, start in starts.items():
            cycle = self._graph.cycle(name)
            if cycle is not None:
                self._set_route(ModelHandle(name, None, {-1: VersionHandle(-1, UNAVAILABLE, cycle)}, ()))
                done[name].fail(LoadRefused(TritonError.invalid_arg(cycle), "model"))  # Triton's model stage
                continue
            waits = [done[d] for d in self._graph.of(name) if d in done]
            ref = self._actor_for(name).ref
            if waits:
                gevent.spawn(start_after, waits, start, ref, done[name])
            else:
                start(ref, done[name])
        return done

    def _disk_deps(self, found: dict[str, list[Path]]) -> Callable[[str], tuple[str, ...] | None]:
        def lookup(name: str) -> tuple[str, ...] | None:
            dirs = found.get(name) if layout.is_valid_model_name(name) else None
            return read_deps(name, dirs[0], self._settings.config_name) if dirs and len(dirs) == 1 else None

        return lookup

    # -- helpers ----------------------------------------------------------------------------------
    def _actor_for(self, name: str) -> ModelActor:
        actor = self._models.get(name)
        if actor is None:
            actor = ModelActor(name, self._backends, self._settings, self._publisher(), self._gate, parent=self,
                               routes=lambda: self.routes, announce=self._announce)
            actor.start()
            self._models[name] = actor
        return actor

    def _publisher(self) -> Any:
        """What a model actor calls to publish a handle: the Reply completes once ``routes`` holds it, so
        the actor can drain an old version knowing no new request will be routed to it."""
        ref = self.ref

        def publish(handle: ModelHandle) -> Reply[None]:
            applied: Reply[None] = Reply()
            try:
                ref.tell(ModelChanged(handle, applied))
            except TritonError:
                applied.set(None)  # the repository stopped (shutdown): nothing routes any more
            return applied

        return publish

    def _set_route(self, handle: ModelHandle) -> None:
        routes = dict(self.routes)
        routes[handle.name] = handle
        self.routes = MappingProxyType(routes)

    # -- read-only views for the front ends (any greenlet) ----------------------------------------
    def lookup(self, name: str) -> ModelHandle:
        handle = self.routes.get(name)
        if handle is None:
            raise TritonError.not_found(f"Request for unknown model: '{name}' is not found")
        return handle

    def all_ready(self) -> bool:
        """Strict readiness: every version of every model is READY (except ones unloaded on purpose)."""
        for handle in self.routes.values():
            if not handle.versions:
                return False
            for vh in handle.versions.values():
                if vh.state != READY and vh.reason != "unloaded":
                    return False
        return True


def _poll_failed(name: str) -> str:
    return f"failed to load '{name}', failed to poll from model repository"

"""ModelActor: the versions of one model, their ready states, and loading, reloading and unloading them.

Messages (through :class:`ModelRef`): :class:`Load` (read the config, load what its version policy
names; its ``reply`` completes when the load finished or failed; POLL tells it without a reply, and a
load failure is then only logged and shown in the index), :class:`Unload` (drain and finalize every
version; its reply completes when done), :class:`Restart` (from the supervisor, the first message of
a replacement actor: adopt the failed actor's versions and reload them, or give up on them),
:class:`VersionDown` (event from a version's scheduler: every instance is DOWN; the version turns
UNAVAILABLE with the reason and is unloaded, until a load or a POLL change loads it again; the actor
then *announces* it, so that with several worker processes every worker does the same),
:class:`MarkDown` (from the host: a version lost its instances in another worker process; it turns
UNAVAILABLE here too, with the same reason, unless this worker loaded it again since).
State owned: the version records (state, reason, scheduler, instances), the serving config, where it
was loaded from (directory and :class:`~...repository.snapshot.Stamp`), and a private override
directory when the load API supplied files. After every change it publishes an immutable
:class:`ModelHandle`; the front ends route through the handle without a round trip to this actor.

Reload is load-then-swap (https://github.com/triton-inference-server/server/issues/2076): the versions that changed are loaded (and warmed
up) beside the serving ones; only when all of them are READY is the new handle swapped into the
routing table; then the replaced versions drain (requests in flight finish on them) and unload, in a
helper greenlet (:class:`~.version.Drains`): the load answers at the swap and the mailbox goes on (the next
reload waits for that drain).
A failed update changes nothing that serves: the old versions keep serving and carry the failure
as their ``reason`` in the index. A ``version_policy`` change loads and unloads only the versions it
adds and removes. Lifecycle operations on one model are serialized by this actor's mailbox; loads of
different models share the repository's gate (``--model-load-thread-count``).
Failure: a version that fails its first load is UNAVAILABLE with the reason; the other versions serve.
An unexpected error (not a TritonError) in a tell goes to the RepositoryActor, which restarts this
actor within a budget (:mod:`...runtime.supervisor`): :meth:`ModelActor.hand_over` stops it without unloading,
and the replacement reloads what was serving (load-then-swap, the old routing snapshot serving
meanwhile); past the budget the replacement marks every version UNAVAILABLE with the reason and
unloads them. Messages still queued in the failed actor fail UNAVAILABLE ("actor stopped").
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import gevent
import gevent.lock

from ...backends.base import Backend
from ...errors import TritonError
from ...repository import config as config_mod
from ...repository import snapshot
from ...repository.config import ModelConfig, without_version_policy
from ...repository.public_paths import LOAD_REQUEST, PublicPaths, public_text
from ...runtime.kernel import Actor, Reply
from ..scheduling.ensemble import Routes
from .handles import LOADING, READY, UNAVAILABLE, UNLOADING, ModelHandle
from .messages import (
    Handover,
    Load,
    LoadRefused,
    LoadSettings,
    MarkDown,
    ModelRef,
    Restart,
    Settle,
    Unload,
    VersionDown,
    _Drained,
    failure_text,
    raise_failures,
)
from .plan import Plan, prepare
from .version import Drains, Version, VersionSource, start_version, stop_version

log = logging.getLogger(__name__)
Publish = Callable[[ModelHandle], Reply[None]]  # answered once the routing table holds the handle
# (model, version, reason, files digest): a version of this worker lost every instance; called in the
# model actor's greenlet, it must not block (hostwide.LostVersions spawns the host-wide broadcast)
Announce = Callable[[str, int, str, str], None]
LOST = "no instance left: "  # the reason of a version whose instances were lost starts with this
SUPERSEDED = "changed since it lost its instances"  # MarkDown(here=True) found it loaded again or re-reported


class ModelActor(Actor):
    """Owns the versions of one model."""

    ref_class = ModelRef
    ref: ModelRef

    def __init__(self, name: str, backends: dict[str, Backend], settings: LoadSettings, publish: Publish,
                 gate: gevent.lock.Semaphore | None = None, parent: Actor | None = None,
                 routes: Routes | None = None, announce: Announce | None = None) -> None:
        super().__init__(f"model:{name}", parent)
        self.model = name
        self._announce: Announce = announce or (lambda *_: None)
        self._routes: Routes = routes or (lambda: {})  # the routing table (ensembles check and route through it)
        self._backends = backends
        self._settings = settings
        self._publish = publish
        self._gate = gate or gevent.lock.Semaphore(1)
        self._config: ModelConfig | None = None
        self._versions: dict[int, Version] = {}
        self._source: tuple[Path, snapshot.Stamp] | None = None  # None: nothing loaded, or an override
        self._owned_dir: Path | None = None
        self._private: Path | None = None  # the load request's temporary folder, never named to a client
        self._serving: Load | None = None  # the load whose result serves (a restart replays it)
        self._handover: Reply[Handover] | None = None  # set by hand_over: on_stop hands the state over
        self._drains = Drains(name)  # replaced versions draining behind a reload

    # -- messages ---------------------------------------------------------------------------------
    def on_Load(self, msg: Load) -> None:
        try:
            with self._gate:
                self._load(msg)
        except TritonError as e:
            if msg.reply is not None:
                raise  # the kernel fails msg.reply with it
            log.error("loading '%s' failed: %s", self.model, e.message)  # the index shows it too
        else:
            if msg.reply is not None:
                msg.reply.set(None)
        finally:
            if msg.owned and self._owned_dir != msg.model_dir:
                shutil.rmtree(msg.model_dir, ignore_errors=True)

    def on_Unload(self, msg: Unload) -> None:
        live = [rec for rec in self._versions.values() if rec.running]
        for rec in self._versions.values():
            if rec.state == READY:
                rec.to(UNLOADING)
        self._publish_now(wait=True)  # no new request reaches a version once it is UNLOADING
        if msg.stopping is not None:
            msg.stopping.set(None)
        for rec in live:
            stop_version(rec, self.model)
        for rec in self._versions.values():
            rec.to(UNAVAILABLE, "unloaded")
        self._drains.wait()  # the reloads' old versions: gone too when this answers (their folders with them)
        self._source = self._serving = None
        self._drop_owned_dir(None)
        self._publish_now()
        msg.reply.set(None)

    def on_Settle(self, msg: Settle) -> None:
        self._drains.settled(msg.reply)

    def on_VersionDown(self, msg: VersionDown) -> None:
        """Every instance of a serving version is DOWN: it is not ready any more (model ready false, the
        index UNAVAILABLE with the reason, strict server readiness false), as Triton's model readiness
        turns false when ``TRITONBACKEND_ModelInstanceReady`` fails. Its requests are refused with
        Triton's answer for a version that is not ready; a load brings it back with fresh instances."""
        rec = self._versions.get(msg.version)
        if rec is None or rec.scheduler is not msg.scheduler or rec.state != READY:
            return  # replaced or unloaded meanwhile
        reason = f"{LOST}{msg.reason}"
        log.error("model '%s' version %d is unavailable: %s", self.model, msg.version, reason)
        rec.to(UNAVAILABLE, reason)
        self._publish_now(wait=True)  # nothing is routed to it any more
        self._announce(self.model, msg.version, reason, self._files_digest())
        self._drains.start([rec], lambda: None)  # its requests in flight finish behind the mailbox

    def on_MarkDown(self, msg: MarkDown) -> None:
        """The host's word that a version lost its instances (Triton: one dead instance makes the model not
        ready), so that every worker process answers the same. Another worker's healthy instances are
        unloaded with it: in-flight requests finish, new ones get the answer for a version not ready."""
        rec = self._versions.get(msg.version)
        if msg.here:  # under the host's control lock: has anything loaded it again since it went down?
            if rec is None or rec.state != UNAVAILABLE or rec.reason != msg.reason:
                raise TritonError.unavailable(f"model '{self.model}' version {msg.version} {SUPERSEDED} (loaded "
                                              "again, or another worker's report of it came first)")
            msg.reply.set(False)
            return
        same_load = not msg.files or not self._files_digest() or msg.files == self._files_digest()
        lost = rec is not None and rec.state == UNAVAILABLE and rec.reason.startswith(LOST)
        if rec is None or not same_load or not (rec.state == READY or lost):
            msg.reply.set(False)  # not loaded here, or loaded from other files (POLL): not that load
            return
        log.error("model '%s' version %d is unavailable: %s (in another worker process)", self.model,
                  msg.version, msg.reason)
        rec.to(UNAVAILABLE, msg.reason)  # the same reason everywhere (the last broadcast's, if two raced)
        self._publish_now(wait=True)
        msg.reply.set(True)  # the broadcast need not wait for the drain, nor this mailbox
        if rec.running:
            self._drains.start([rec], lambda: None)

    def _files_digest(self) -> str:
        return self._source[1].digest() if self._source is not None else ""

    def _version_down(self, version: int, scheduler: object, reason: str) -> None:
        """A scheduler's callback (hub, in its handler): the event goes through this actor's mailbox."""
        gevent.spawn(self._tell_self, VersionDown(version, scheduler, reason))  # never block the scheduler

    def _tell_self(self, msg: object) -> bool:
        try:
            self.ref.tell(msg)
        except TritonError:
            return False  # this actor stopped (unloaded, or handed over: the replacement reloads the model)
        return True

    # -- supervision ------------------------------------------------------------------------------
    def hand_over(self) -> Reply[Handover]:
        """Supervisor's greenlet: stop this failed actor *without* unloading; the reply completes with
        its state once its loop ended (after the message it may be handling now)."""
        handover: Reply[Handover] = Reply()
        if not self.alive:
            handover.fail(TritonError.unavailable(f"actor '{self.name}' already stopped"))
            return handover
        self._handover = handover
        self.stop(timeout=0)
        return handover

    def on_Restart(self, msg: Restart) -> None:
        """First message of a replacement actor. Waits for the failed actor to stop (not an ask: the old
        actor never waits for this one), adopts its versions, then reloads or gives up."""
        try:
            state = msg.handover.get()
        except TritonError as e:
            log.error("model '%s': nothing handed over after the restart (%s)", self.model, e.message)
            return
        self._versions, self._config, self._source = state.versions, state.config, state.source
        self._owned_dir, self._serving = state.owned_dir, state.serving
        if msg.give_up is not None:
            self._give_up(msg.give_up)
            return
        leftovers = [rec for rec in self._versions.values() if rec.state in (LOADING, UNLOADING)]
        for rec in leftovers:  # what the failure interrupted is not routed to: nothing to drain
            rec.to(UNAVAILABLE, f"interrupted by an internal error: {msg.error}")
        if self._versions:
            self._publish_now()
        for rec in leftovers:
            if rec.running:
                stop_version(rec, self.model)
        if self._serving is not None and any(rec.state == READY for rec in self._versions.values()):
            log.info("model '%s': restarted after an internal error; reloading what was serving", self.model)
            try:
                with self._gate:
                    self._load(dataclasses.replace(self._serving, reply=None, reload=True))
            except TritonError as e:  # the old versions keep serving, the index says why
                log.error("model '%s': reload after the restart failed: %s", self.model, e.message)

    def _give_up(self, reason: str) -> None:
        """Past the restart budget: every version UNAVAILABLE with ``reason``, then drain and unload."""
        if not self._versions:
            self._versions[-1] = Version(-1, UNAVAILABLE, reason)
        live = [rec for rec in self._versions.values() if rec.running]
        for rec in self._versions.values():
            rec.to(UNAVAILABLE, reason)
        self._publish_now(wait=True)  # nothing is routed to them any more
        for rec in live:
            stop_version(rec, self.model)
        self._source = self._serving = None
        self._drop_owned_dir(None)

    # -- loading ----------------------------------------------------------------------------------
    def _load(self, msg: Load) -> None:
        self._private = msg.model_dir if msg.owned else None
        stamp = snapshot.take(msg.model_dir)
        serving = {v: rec for v, rec in self._versions.items() if rec.state == READY}
        unchanged = msg.config is None and not msg.reload and self._source == (msg.model_dir, stamp)
        if unchanged and serving and all(r.state == READY or r.reason == "unloaded" for r in self._versions.values()):
            return  # Triton: loading an unchanged, loaded model is a no-op
        try:
            plan = prepare(self.model, msg.model_dir, msg.config, stamp, self._settings, self._backends, self._routes)
        except TritonError as e:
            public = self._public(e)
            self._update_failed(serving, public.status_text())
            raise public from None
        if not serving:
            self._first_load(plan, msg)
        else:
            self._update(plan, msg, serving)

    def _first_load(self, plan: Plan, msg: Load) -> None:
        """Nothing serves yet: each version becomes READY or UNAVAILABLE on its own."""
        self._versions = {v: Version(v, LOADING) for v in plan.selected}
        self._config = plan.config
        self._publish_now()
        self._versions.update(self._start(plan, list(plan.selected)))
        self._loaded_from(plan, msg)
        self._publish_now()
        raise_failures(self.model, self._versions)

    def _update(self, plan: Plan, msg: Load, serving: dict[int, Version]) -> None:
        """Load what changed beside what serves, swap, then drain and unload what was replaced."""
        whole = (msg.reload or msg.config is not None or self._source is None or self._source[0] != plan.model_dir
                 or without_version_policy(plan.config) != without_version_policy(self._config)
                 or plan.stamp.outside_versions() != self._source[1].outside_versions())
        todo = [v for v, path in plan.selected.items()
                if whole or v not in serving or serving[v].files != plan.stamp.part(path.name)]
        dropped = [v for v in serving if v not in plan.selected]
        added = [v for v in todo if v not in serving]
        if not todo and not dropped:  # e.g. a version_policy edit that selects the same versions
            self._config = plan.config
            self._loaded_from(plan, msg)
            for rec in serving.values():
                rec.to(READY)
            self._publish_now()
            return
        # one generation drains at a time: a load told during a drain waits for it, or reloads in a row
        # behind one request that never ends would pile up old versions in memory without bound (an unload
        # or a health report does not wait: they free memory)
        self._drains.wait()
        for v in added:
            self._versions[v] = Version(v, LOADING)  # visible while loading, as in Triton
        if added:
            self._publish_now()
        started = self._start(plan, todo)
        if any(rec.state != READY for rec in started.values()):
            for rec in started.values():
                if rec.running:
                    stop_version(rec, self.model)  # never routed to: nothing to drain
            for v in added:
                del self._versions[v]
            self._update_failed(serving, failure_text(self.model, started))
            raise_failures(self.model, started)
        replaced = [serving[v] for v in todo if v in serving] + [serving[v] for v in dropped]
        self._versions = {v: rec for v, rec in self._versions.items()  # Triton keeps listing unloaded versions
                          if (rec.state in (READY, UNLOADING) or rec.reason == "unloaded") and v not in dropped}
        self._versions.update(started)
        for rec in self._versions.values():
            rec.to(rec.state)  # same state, the reason cleared
        for v in dropped:
            self._versions[v] = serving[v]
            serving[v].to(UNLOADING)
        self._config = plan.config
        self._publish_now(wait=True)  # the swap: from here on new requests go to the new versions
        if msg.reply is not None and replaced:  # done once the new versions serve (Triton's): answered after the
            msg.reply.set(None)  # drain, a BLS caller reloading its own model waited for its own request for good
        old_dir = self._loaded_from(plan, msg, keep_old=bool(replaced))
        if replaced:  # in-flight requests finish on the old versions, behind this mailbox; then their files go
            gone = [serving[v] for v in dropped]
            self._drains.start(replaced, lambda: self._drained(gone, old_dir))

    def on__Drained(self, msg: _Drained) -> None:
        """A reload's replaced versions are gone: the dropped ones say so (unless loaded again since)."""
        gone = [rec for rec in msg.records if self._versions.get(rec.version) is rec and rec.state == UNLOADING]
        for rec in gone:
            rec.to(UNAVAILABLE, "unloaded")
        if gone:
            self._publish_now()
        if msg.old_dir is not None and msg.old_dir != self._owned_dir:
            shutil.rmtree(msg.old_dir, ignore_errors=True)

    def _start(self, plan: Plan, versions: list[int]) -> dict[int, Version]:
        """Start ``versions`` in parallel helper greenlets; every result is READY or UNAVAILABLE."""
        config_json = config_mod.to_json_text(plan.config)
        backend_config = self._settings.backend_config.get(plan.config.backend, {})
        jobs = {
            v: gevent.spawn(start_version, VersionSource(
                self.model, v, plan.model_dir, plan.selected[v], plan.config, config_json, plan.backend,
                backend_config, plan.stamp.part(plan.selected[v].name), self._settings.workers, plan.graph,
                self._routes, self._version_down, self._settings.tracer, self._settings.server_hooks,
                self._settings.rate_limiter, self._settings.response_cache, self._settings.streams,
                self._public_paths()),
                self._settings.load_timeout_s, self._settings.latency_metrics, self._settings.load_retries)
            for v in versions
        }
        gevent.joinall(list(jobs.values()))
        started = {v: job.value or Version(v, UNAVAILABLE, "load interrupted") for v, job in jobs.items()}
        for rec in started.values():
            rec.reason = self._public_text(rec.reason)  # the index and the load's error show it
        return started

    def _public(self, e: TritonError) -> TritonError:
        text = self._public_text(e.message)
        if text == e.message:
            return e
        if isinstance(e, LoadRefused):
            return LoadRefused(TritonError(e.code, text), e.stage, e.versions)
        return TritonError(e.code, text)

    def _public_text(self, text: str) -> str:
        """``text`` with the temporary folder a load request's files were written to named as
        ``<load request>``, an object-store repository's copy as its URL: a model's traceback showed the
        server's temporary path to the client."""
        return public_text(text, self._public_paths())

    def _public_paths(self) -> PublicPaths:
        """The server's folders this model's files may live in, and what a client reads for them."""
        paths = self._settings.public_paths
        return paths if self._private is None else ((str(self._private), LOAD_REQUEST), *paths)

    def _loaded_from(self, plan: Plan, msg: Load, keep_old: bool = False) -> Path | None:
        """Record what serves now; the old override folder goes now, or with ``keep_old`` it is returned
        (versions still draining read their files from it)."""
        # an override marks the source stale: a later load without one reloads from disk (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md)
        self._source = None if msg.config is not None else (plan.model_dir, plan.stamp)
        self._serving = dataclasses.replace(msg, reply=None, reload=False)
        keep = plan.model_dir if msg.owned else None
        old = self._owned_dir if keep_old and self._owned_dir != keep else None
        if old is not None:
            self._owned_dir = keep
        self._drop_owned_dir(keep)
        return old

    def _drained(self, gone: list[Version], old_dir: Path | None) -> None:
        """A drain's end (its helper greenlet), through the mailbox; an actor stopped meanwhile (handed over)
        owns the records no more, but the old folder still goes."""
        if not self._tell_self(_Drained(gone, old_dir)) and old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    def _drop_owned_dir(self, keep: Path | None) -> None:
        if self._owned_dir is not None and self._owned_dir != keep:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
        self._owned_dir = keep

    def _update_failed(self, serving: dict[int, Version], reason: str) -> None:
        """A load that failed before anything new served: what serves keeps serving, with the reason."""
        if not serving:
            if not self._versions:
                self._versions[-1] = Version(-1, UNAVAILABLE, reason)
            for rec in self._versions.values():
                rec.to(UNAVAILABLE, reason)
        for rec in serving.values():
            rec.to(READY, f"update failed, the previous version keeps serving: {reason}")
        self._publish_now()

    def _publish_now(self, wait: bool = False) -> None:
        versions = {v: rec.handle() for v, rec in sorted(self._versions.items())}
        ready = tuple(v for v, h in versions.items() if h.state == READY)
        applied = self._publish(ModelHandle(self.model, self._config, versions, ready))
        if wait:
            try:
                applied.get(timeout=60)
            except TritonError as e:
                log.error("model '%s': routing table not updated: %s", self.model, e)

    def on_stop(self) -> None:
        if self._handover is not None:  # restarted by the supervisor: the replacement takes it all
            self._handover.set(Handover(self._versions, self._config, self._source, self._owned_dir, self._serving))
            self._versions, self._owned_dir = {}, None
            return
        for rec in self._versions.values():
            if rec.running:
                stop_version(rec, self.model)
        self._drains.wait()
        self._drop_owned_dir(None)

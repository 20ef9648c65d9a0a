"""RepositoryActor: the model repositories on disk, the control mode, the model actors, the routing table.

Messages: :class:`LoadAll` (ask; answered when every model's load finished), :class:`ModelChanged`
(event from a model actor carrying its new handle), :class:`Index` (ask), :class:`UnloadAll` (ask).
State owned: repository paths, control mode, model actors, and the routing table ``routes``
(name → :class:`ModelHandle`), an immutable dict replaced on every change, so front ends read it
with no round trip. Failure: a model that fails to load is UNAVAILABLE with its reason in the index;
the others serve.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import gevent

from ..backends.base import Backend
from ..errors import TritonError
from ..repository import layout
from .kernel import Actor, Reply
from .model import READY, Load, LoadSettings, ModelActor, ModelHandle, Unload

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadAll:
    pass


@dataclass(frozen=True, slots=True)
class _LoadsFinished:
    reply: Reply[dict[str, str]]
    failures: dict[str, str]


@dataclass(frozen=True, slots=True)
class ModelChanged:
    handle: ModelHandle


@dataclass(frozen=True, slots=True)
class Index:
    ready_only: bool = False


@dataclass(frozen=True, slots=True)
class UnloadAll:
    pass


class RepositoryActor(Actor):
    """Owns what is on disk and which model actors exist."""

    def __init__(self, repositories: list[Path], backends: dict[str, Backend], settings: LoadSettings,
                 control_mode: str = "none") -> None:
        super().__init__("repository")
        self.repositories = repositories
        self.control_mode = control_mode
        self._backends = backends
        self._settings = settings
        self._models: dict[str, ModelActor] = {}
        self.routes: MappingProxyType[str, ModelHandle] = MappingProxyType({})

    # -- messages ---------------------------------------------------------------------------------
    def on_LoadAll(self, _msg: LoadAll) -> Reply[dict[str, str]]:
        """Start every model's load in parallel; the answer (model → error) comes via _LoadsFinished."""
        found = layout.list_models(self.repositories)
        pending: dict[str, Reply[None]] = {}
        failures: dict[str, str] = {}
        for name, dirs in found.items():
            if len(dirs) > 1:
                failures[name] = f"model '{name}' appears in more than one repository: {', '.join(map(str, dirs))}"
                self._set_route(ModelHandle(name, None, {}, ()))
                continue
            actor = self._actor_for(name)
            pending[name] = actor.ref.ask_async(Load(dirs[0]))
        reply: Reply[dict[str, str]] = Reply()
        gevent.spawn(self._await_loads, pending, failures, reply)
        return reply

    def _await_loads(self, pending: dict[str, Reply[None]], failures: dict[str, str], reply: Reply[dict[str, str]]) -> None:
        """Helper greenlet: wait for the loads, then report back through the mailbox (keeps ordering)."""
        for name, r in pending.items():
            try:
                r.get()
            except Exception as e:  # noqa: BLE001
                failures[name] = str(e)
        self.ref.tell(_LoadsFinished(reply, failures))

    def on__LoadsFinished(self, msg: _LoadsFinished) -> None:
        msg.reply.set(msg.failures)

    def on_ModelChanged(self, msg: ModelChanged) -> None:
        self._set_route(msg.handle)

    def on_Index(self, msg: Index) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        names = set(layout.list_models(self.repositories)) | set(self.routes)
        for name in sorted(names):
            handle = self.routes.get(name)
            if handle is None or not handle.versions:
                if not msg.ready_only:
                    entries.append({"name": name} if handle is None else
                                   {"name": name, "state": "UNAVAILABLE", "reason": "duplicate model name"})
                continue
            for v, vh in handle.versions.items():
                if msg.ready_only and vh.state != READY:
                    continue
                entry: dict[str, Any] = {"name": name}
                if v >= 0:
                    entry["version"] = str(v)
                entry["state"] = vh.state
                if vh.reason:
                    entry["reason"] = vh.reason
                entries.append(entry)
        return entries

    def on_UnloadAll(self, _msg: UnloadAll) -> Reply[None]:
        replies = [actor.ref.ask_async(Unload()) for actor in self._models.values()]
        done: Reply[None] = Reply()

        def wait() -> None:
            for r in replies:
                try:
                    r.get()
                except Exception as e:  # noqa: BLE001
                    log.error("unload failed: %s", e)
            for actor in self._models.values():
                actor.stop()
            done.set(None)

        gevent.spawn(wait)
        return done

    # -- helpers ----------------------------------------------------------------------------------
    def _actor_for(self, name: str) -> ModelActor:
        actor = self._models.get(name)
        if actor is None:
            ref = self.ref
            actor = ModelActor(name, self._backends, self._settings, lambda h: ref.tell(ModelChanged(h)), parent=self)
            actor.start()
            self._models[name] = actor
        return actor

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

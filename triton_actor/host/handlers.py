"""This process's side of what is host-wide: the handlers a :class:`~.base.Host` runs here, and the
proxies that send changes through the host.

* :func:`register_handlers` -- statistics (this process's raw per-version counters), model control, model
  readiness and whether a model is known, shared-memory registration and the log / trace settings, each as a host handler.
* :class:`HostSharedMemory` and :class:`HostRuntimeSettings` stand where the front ends use the registry and
  the settings (``plane.shm``, ``plane.runtime``): reads are local, changes go to ``host.broadcast`` so every
  worker makes them (in one process, ``LocalHost`` calls the local handler: the same code path).
* :class:`LostVersions` makes a version that lost every instance in one worker UNAVAILABLE in every
  worker, with the same reason (a journaled change, so a worker that starts later agrees).
* :func:`sum_statistics` adds per-version snapshots of several workers, as one server would have counted.

Thread: host handlers run in greenlets on the hub (a control connection's, or the caller's in one process).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import gevent

from ..actors.model.actor import SUPERSEDED
from ..actors.model.handles import READY
from ..errors import TritonError
from ..observability.log_trace_settings import RuntimeSettings
from .base import Host
from .shared_memory import SharedMemoryRegistry

if TYPE_CHECKING:
    from ..actors.repository.actor import RepositoryActor

log = logging.getLogger("triton_actor.workers")


def register_handlers(host: Host, repository: RepositoryActor, shm: SharedMemoryRegistry,
                      runtime: RuntimeSettings) -> None:
    def statistics(args: dict[str, Any]) -> list[dict[str, Any]]:
        snaps = []
        for name, handle in sorted(repository.routes.items()):
            if args.get("name") and name != args["name"]:
                continue
            for v in handle.ready_versions:
                if args.get("version", -1) in (-1, v):
                    snaps.append(handle.versions[v].statistics())
        return snaps

    def model_ready(args: dict[str, Any]) -> bool:
        handle = repository.routes.get(args["name"])
        return handle is not None and any(vh.state == READY for vh in handle.versions.values())

    def shm_register(args: dict[str, Any]) -> None:
        if args["kind"] == "system":
            shm.register_system(args["name"], args["key"], args["offset"], args["byte_size"])
        else:
            shm.register_cuda(args["name"], args["raw_handle"], args["device_id"], args["byte_size"])

    def shm_unregister(args: dict[str, Any]) -> None:
        (shm.unregister_system if args["kind"] == "system" else shm.unregister_cuda)(args["name"])

    host.register("statistics", statistics)
    host.register("model.load", lambda a: repository.ref.load(a["name"], a.get("config"), a.get("files"),
                                                              a.get("demand", False)).get())
    host.register("model.unload", lambda a: repository.ref.unload(a["name"], a["unload_dependents"], a.get("wait", False),
                                                                  a.get("demand", False))
                  .get(timeout=a.get("wait_s") if a.get("wait") else 60))
    host.register("model.ready", model_ready)
    # a model this process has a handle for, in any state: an unload of any other name changes nothing
    # (the workers' journal keeps no entry for it)
    host.register("model.known", lambda a: a["name"] in repository.routes)
    host.register("shm.register", shm_register)
    host.register("shm.unregister", shm_unregister)
    host.register("runtime.log", lambda a: runtime.update_log(a["changes"]))
    host.register("runtime.trace", lambda a: runtime.update_trace(a["changes"], a.get("model", "")))


def replay(host: Host, changes: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Apply journaled changes to this process only (a worker that starts); returns the errors."""
    errors = []
    for _key, kind, args in changes:
        try:
            host.local(kind, args)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - one change failing must not stop the others
            errors.append(f"{kind} {args.get('name', '')}: {e}")
    return errors


class LostVersions:
    """A version whose instances were all lost (its scheduler's ``VersionDown``) goes down host-wide.

    The model actor marks it UNAVAILABLE here at once, then calls :meth:`announce`, which spawns
    ``host.broadcast("model.down")``: under the host's control lock this worker first checks that nothing
    loaded the version again meanwhile (else the broadcast stops there), then every other worker marks it
    UNAVAILABLE with the same reason, and the journal records it (a worker that starts later replays it;
    a later ``model.load`` or ``model.unload`` of the model clears it). Two workers that lose the same
    version at once broadcast one after the other; the last reason wins everywhere. In one process
    (``LocalHost``) the broadcast is that check alone. ``token`` tells this process's announcements
    from other workers' (a pid could come back in a later worker).

    Thread: :meth:`announce` runs in the model actor's greenlet and never blocks it; the broadcast runs
    in a greenlet of its own (it may wait for the lock while another worker loads a model)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.token = uuid.uuid4().hex

    def register(self, repository: RepositoryActor) -> None:
        self.host.register("model.down", lambda a: repository.ref.mark_down(
            a["name"], a["version"], a["reason"], a["files"], a["origin"] == self.token).get())

    def announce(self, model: str, version: int, reason: str, files: str) -> None:
        args = {"name": model, "version": version, "reason": reason, "files": files, "origin": self.token}
        gevent.spawn(self._broadcast, args)

    def _broadcast(self, args: dict[str, Any]) -> None:
        try:
            self.host.broadcast("model.down", args)
        except TritonError as e:  # superseded (nothing to do), shutting down, a worker that did not answer
            level = logging.INFO if SUPERSEDED in e.message else logging.WARNING
            log.log(level, "model '%s' version %d: not made unavailable on every worker: %s", args["name"],
                    args["version"], e.message)


class HostSharedMemory:
    """``plane.shm`` with registrations made host-wide; reads and data access stay local."""

    def __init__(self, registry: SharedMemoryRegistry, host: Host) -> None:
        self.registry = registry
        self.host = host
        self.read, self.write = registry.read, registry.write  # the request path: no __getattr__ detour

    def __getattr__(self, name: str) -> Any:  # status, read, write, close: this process's registry
        return getattr(self.registry, name)

    def register_system(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self.host.broadcast("shm.register", {"kind": "system", "name": name, "key": key, "offset": offset,
                                             "byte_size": byte_size})

    def register_cuda(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        self.host.broadcast("shm.register", {"kind": "cuda", "name": name, "raw_handle": raw_handle,
                                             "device_id": device_id, "byte_size": byte_size})

    def unregister_system(self, name: str = "") -> None:
        self.host.broadcast("shm.unregister", {"kind": "system", "name": name})

    def unregister_cuda(self, name: str = "") -> None:
        self.host.broadcast("shm.unregister", {"kind": "cuda", "name": name})


class HostRuntimeSettings:
    """``plane.runtime`` with log and trace changes made host-wide; reads stay local."""

    def __init__(self, settings: RuntimeSettings, host: Host) -> None:
        self.settings = settings
        self.host = host

    def __getattr__(self, name: str) -> Any:
        return getattr(self.settings, name)

    def update_log(self, changes: dict[str, Any]) -> dict[str, Any]:
        return self.host.broadcast("runtime.log", {"changes": changes})[0]

    def update_trace(self, changes: dict[str, list[str]], model: str = "") -> dict[str, list[str]]:
        return self.host.broadcast("runtime.trace", {"changes": changes, "model": model})[0]


def _add(a: Any, b: Any) -> Any:
    """Counters of two workers added: numbers summed, dicts by key, sequences element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: _add(a[k], v) if k in a else v for k, v in b.items()}}
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return tuple(_add(x, y) for x, y in zip(a, b, strict=True))
    return a


def _normal(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as it is after a trip through JSON: batch sizes as ints, pairs as tuples."""
    return {**snap, "durations": {k: tuple(v) for k, v in snap["durations"].items()},
            "batches": {int(k): tuple(v) for k, v in snap["batches"].items()}}


def sum_statistics(per_worker: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-version snapshots of every worker, added up as one server would have counted them: every
    number summed (fields added later are summed too), the latest ``last_inference``; the order is the
    first worker's, versions only other workers have come after."""
    total: dict[tuple[str, int], dict[str, Any]] = {}
    for snaps in per_worker:
        for snap in map(_normal, snaps):
            key = (snap["name"], int(snap["version"]))
            into = total.get(key)
            if into is None:
                total[key] = snap
                continue
            last = max(into["last_inference"], snap["last_inference"])
            merged = _add({k: v for k, v in into.items() if k not in ("name", "version")},
                          {k: v for k, v in snap.items() if k not in ("name", "version")})
            total[key] = {**into, **merged, "last_inference": last}
    for snap in total.values():
        snap["batches"] = dict(sorted(snap["batches"].items()))
    return list(total.values())

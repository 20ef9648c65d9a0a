"""The model memory budget (``--model-memory-budget=BYTES|PERCENT``, with ``--model-load-on-demand``): loaded
models hold at most that much host memory; a load that needs room first unloads the least recently used
idle models, and is refused when nothing can go.

Footprints are measured, not guessed: the unique set size of this process and the processes under it
(isolated Python models, runtime/process_memory.py) before and after each load, so loads are serialised
(:attr:`MemoryBudget._lock`) and every delta is one model's. A model's last measured footprint is the
estimate for its next load; a model never measured is estimated from its files' size on disk (plus 4 MiB),
and the accounting is corrected once it is measured (a larger model than estimated may push other models out
after its load). The models loaded at startup (``--load-model``) are pinned: never evicted, and their
footprint (measured once, around the startup loads) is held back from the budget. A model larger than
the budget left by the pinned ones is refused without evicting anything.

Eviction is the unload API's (host ``model.unload`` with ``wait``): the model stops taking requests,
the requests it holds finish, then its memory is freed; a request that arrives meanwhile loads it
again on demand. Idle models (no queued or running request) go first; when all are serving, the least
recently used still goes (drained) rather than refusing; only pinned models are never unloaded.
Recency is a dict write of the loop time per routed request (:meth:`touch`), only while a budget is set.

Loads through the load API go through :meth:`load` too (measured, evictable). A model unloaded through
the API leaves the accounting at the next decision.

A reload holds both versions for a while: the new one loads beside the old one, which serves until the
swap and then drains (its requests in flight finish) before it is freed. So a reload makes room for the new
version with the old one still counted, and the old one's bytes stay counted (*draining*) until its model
actor has drained and unloaded it (:meth:`RepositoryRef.settled`); a reload that cannot fit beside the old
version is refused and the old version keeps serving.

**With ``--workers``** every worker loads its own copy of every model (the load and unload broadcasts, the
journal), so the budget is the host's: the sum over workers. Each worker keeps its own share (its
measured bytes of each model it loaded, its pinned bytes, when it last served each model); a decision is
made by one worker at a time for the host (the host lock ``memory-budget``, :meth:`Host.exclusive`): it
gathers every worker's share (``budget.state``: host used = the sum, recency = the latest of any worker,
busy = busy in any worker), evicts through the unload broadcast (every worker unloads, the journal keeps
the host's resident set for a worker that starts later), and measures the load in every worker
(``budget.measure`` before and after: each worker records its own delta as its share). So every worker
holds the same resident set and each one's footprint counts. With one process the same code gathers its
one share: nothing else changes. Metrics and the status page add the workers' shares up.
Owner: the data plane; everything runs in hub greenlets.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import gevent
import gevent.lock

from ..actors.repository.actor import RepositoryActor
from ..errors import TritonError
from ..host.base import Host
from ..runtime.kernel import Reply
from ..runtime.process_memory import release_free_memory, return_large_frees, tree_bytes

log = logging.getLogger(__name__)
RECENT = 20  # evictions the status page lists
# added to a never-measured model's files: what an instance holds beside its weights (its thread, module,
# Python objects; about 2 MiB measured for a numpy model), so the first load is not under-estimated
FIRST_LOAD_SLACK = 4 << 20
# how long a decision waits for another worker's (a load in every worker: as long as a load may take)
HOST_LOCK_TIMEOUT_S = 600.0
T = TypeVar("T")


@dataclass
class HostView:
    """Every worker's shares, added up: what a decision for the host looks at (one process: its own)."""

    workers: int
    pinned_bytes: int
    pinned: set[str]
    resident: dict[str, int]  # model → bytes over every worker
    footprints: dict[str, list[int]]  # model → each worker's last measure of it (the workers that have one)
    last_used: dict[str, float]
    busy: set[str]
    unmeasured: set[str]  # loaded in some worker that holds no share of it (a decider died during its load)
    draining: int = 0  # the old versions of reloads, until they are freed

    def used(self) -> int:
        return self.pinned_bytes + self.draining + sum(self.resident.values())

    @classmethod
    def of(cls, parts: list[dict[str, Any]]) -> HostView:
        view = cls(len(parts), 0, set(), {}, {}, {}, set(), set())
        for part in parts:
            view.unmeasured.update(part.get("unmeasured", ()))
            view.pinned_bytes += part["pinned_bytes"]
            view.draining += part.get("draining", 0)
            view.pinned.update(part["pinned"])
            view.busy.update(part["busy"])
            for name, held in part["resident"].items():
                view.resident[name] = view.resident.get(name, 0) + held
            for name, held in part["footprint"].items():
                view.footprints.setdefault(name, []).append(held)
            for name, used in part["last_used"].items():
                view.last_used[name] = max(used, view.last_used.get(name, used))
        return view


class MemoryBudget:
    """Which models hold how much memory, in which order they were last used, and the load decisions."""

    def __init__(self, limit: int, repository: RepositoryActor, host: Host,
                 measure: Callable[[], int] = lambda: tree_bytes(unique=True),
                 release: Callable[[], None] = release_free_memory, unload_wait_s: float = 30.0) -> None:
        self.limit = limit
        # an eviction waits this long for its victim's requests and finalize (the server's
        # --exit-timeout-secs, its one bound on in-flight work): a hung finalize must not hold every later load
        self.unload_wait_s = unload_wait_s
        self.slack = FIRST_LOAD_SLACK
        self._repository = repository
        self._host = host
        self._measure = measure
        self._release = release  # after an eviction: what the model freed really leaves the process
        return_large_frees()  # a model's arrays go back to the system when it is unloaded
        self._lock = gevent.lock.Semaphore()  # one load or eviction at a time: deltas stay one model's
        self._clock = gevent.get_hub().loop.now  # cached loop time: no system call per request
        self.last_used: dict[str, float] = {}
        self.resident: dict[str, int] = {}  # loaded models → measured bytes (this process's share)
        self.footprint: dict[str, int] = {}  # every model measured so far → its last measure (the estimate)
        self.load_secs: dict[str, float] = {}
        self.pinned: set[str] = set()
        self.pinned_bytes = 0
        self.loads = 0
        self.evictions = 0
        self.refusals = 0
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT)
        self._before: dict[str, int] = {}  # model → this process's bytes before its load (budget.measure)
        # the old versions of reloads still draining (this process's share of each), until its model actor
        # says they are gone; keyed by a number of their own: a model reloaded twice drains twice
        self.draining: dict[int, tuple[str, int]] = {}
        self._drain_keys = itertools.count()
        host.register("budget.state", self._state)
        host.register("budget.measure", self._measure_share)

    def touch(self, name: str) -> None:
        self.last_used[name] = self._clock()

    def pin(self, names: list[str], held: int) -> None:
        """The startup models: never evicted; ``held`` bytes (their measured load) kept out of the budget."""
        self.pinned.update(names)
        self.pinned_bytes = max(held, 0)
        log.info("memory budget: %d bytes; %d pinned model(s) hold %d bytes", self.limit, len(names), held)

    def adopt(self, replay: Callable[[], T]) -> T:
        """Run ``replay`` (a worker that starts replays the journal: the models loaded on demand since the
        server started) and count what it added as this worker's share of those models, split in
        proportion to the other workers' measures of them (evenly when none has one)."""
        before = self._measure()
        result = replay()
        grown = max(self._measure() - before, 0)
        routes = self._repository.routes
        names = [n for n, h in routes.items() if h.ready_versions and n not in self.pinned]
        if names:
            view = HostView.of(self._host.gather("budget.state"))
            weights = {n: sum(view.footprints.get(n, [])) / max(len(view.footprints.get(n, [])), 1) or 1.0
                       for n in names}
            total = sum(weights.values())
            for n in names:
                self.footprint[n] = self.resident[n] = int(grown * weights[n] / total)
            log.info("memory budget: this worker's replayed loads hold %d bytes (%s)", grown, ", ".join(sorted(names)))
        return result

    def used(self) -> int:
        """This process's share (with one process, all of it)."""
        return self.pinned_bytes + self.draining_bytes() + sum(self.resident.values())

    def draining_bytes(self) -> int:
        return sum(held for _, held in self.draining.values())

    def load(self, name: str, do_load: Callable[[], None], if_absent: bool = False) -> None:
        """Make room for ``name`` and run ``do_load`` (the load API's host call), measuring what it added in
        every worker; raises UNAVAILABLE when it cannot fit. ``if_absent`` (a load on demand): nothing to do
        when the model is loaded by the time this decision's turn comes (another worker's request loaded it)."""
        with self._lock, self._host.exclusive("memory-budget", HOST_LOCK_TIMEOUT_S):
            if if_absent and self._loaded(name):
                return
            view = HostView.of(self._host.gather("budget.state"))
            for other in view.unmeasured - view.resident.keys():  # counted at their estimate: they can be evicted
                view.resident[other] = self._estimate(view, other)
            need = self._estimate(view, name)
            if need > self.limit - view.pinned_bytes:
                self.refusals += 1
                log.warning("memory budget: refused '%s': needs %d bytes, budget %d (%d held by pinned models)",
                            name, need, self.limit, view.pinned_bytes)
                raise TritonError.unavailable(
                    f"failed to load '{name}': it needs about {need} bytes, more than the model memory budget of "
                    f"{self.limit} bytes leaves beside the pinned models ({view.pinned_bytes} bytes; "
                    f"{view.used()} used now)")
            old = view.resident.get(name, 0)  # a reload: the old version stays counted beside the new one
            self._make_room(view, name, need)
            started = time.monotonic()
            self._host.gather("budget.measure", {"name": name, "phase": "before"})
            do_load()
            grown = sum(self._host.gather("budget.measure", {"name": name, "phase": "after"}))
            self.loads += 1
            view.resident[name] = grown
            view.draining += old  # until its drain ends (each worker's share: budget.measure)
            self.load_secs[name] = time.monotonic() - started
            self.touch(name)
            log.info("memory budget: loaded '%s' in %.2fs: %d bytes measured (%d estimated); %d of %d used",
                     name, self.load_secs[name], grown, need, view.used(), self.limit)
            if view.used() > self.limit:  # the estimate was low: the others make room now
                try:
                    self._make_room(view, name, 0)
                except TritonError as e:
                    log.warning("memory budget: over by %d bytes after loading '%s': %s",
                                view.used() - self.limit, name, e.message)

    def _estimate(self, view: HostView, name: str) -> int:
        """The host's bytes for ``name``: the workers' last measures (one that never loaded it counted as
        their mean), or its files plus the slack in every worker when none has measured it."""
        measured = view.footprints.get(name)
        if measured:
            return sum(measured) * view.workers // len(measured)
        return (on_disk(self._repository.repositories, name) + self.slack) * view.workers

    def _loaded(self, name: str) -> bool:
        handle = self._repository.routes.get(name)
        return handle is not None and bool(handle.ready_versions)

    def _make_room(self, view: HostView, name: str, need: int) -> None:
        while view.used() + need > self.limit:
            victim = self._victim(view, name)
            if victim is None:
                self.refusals += 1
                log.warning("memory budget: refused '%s': %d of %d bytes used, %d needed, nothing evictable",
                            name, view.used(), self.limit, need)
                reload = ""
                if need and view.resident.get(name):
                    reload = (f"; a reload holds both versions until the old one ({view.resident[name]} bytes) "
                              "has drained: unload the model first to load it again within the budget")
                raise TritonError.unavailable(
                    f"failed to load '{name}': model memory budget exhausted: {view.used()} of {self.limit} bytes "
                    f"used ({view.pinned_bytes} by pinned models), about {need} needed, and no loaded model can be "
                    f"unloaded{reload}")
            self._evict(view, victim, name)

    def _victim(self, view: HostView, loading: str) -> str | None:
        """The least recently used model that is resident, unpinned and idle (in every worker); when every
        one is serving, the least recently used of them (its unload waits for its requests: refusing the
        load instead would fail a request only because the others were busy at that instant)."""
        order = [n for n in sorted(view.resident, key=lambda n: view.last_used.get(n, 0.0))
                 if n != loading and n not in view.pinned]
        return next((n for n in order if n not in view.busy), order[0] if order else None)

    def _busy(self, name: str) -> bool:
        handle = self._repository.routes.get(name)
        if handle is None:
            return False
        for v in handle.ready_versions:
            try:
                status = handle.versions[v].live_status()
            except TritonError:
                continue  # going away already
            if status["queued"] or status["running"]:
                return True
        return False

    def _evict(self, view: HostView, victim: str, loading: str) -> None:
        held = view.resident[victim]
        log.info("memory budget: evicting '%s' (%d bytes, least recently used%s) to load '%s'",
                 victim, held, ", waiting for its requests" if victim in view.busy else ", idle", loading)
        started = time.monotonic()
        try:
            self._host.broadcast("model.unload", {"name": victim, "unload_dependents": True, "wait": True,
                                                   "demand": True, "wait_s": self.unload_wait_s})
        except (gevent.Timeout, TritonError) as e:
            # the victim keeps its bytes (it is still going away): the load fails, later loads are not held
            log.error("memory budget: '%s' did not finish unloading within %.0f s (%s); refusing '%s'",
                      victim, self.unload_wait_s, e, loading)
            raise TritonError.unavailable(
                f"failed to load '{loading}': evicting '{victim}' did not finish within {self.unload_wait_s:.0f} s "
                "(its requests or its finalize are still running); it keeps its memory until it is gone") from None
        view.resident.pop(victim, None)
        self.forget_unloaded()  # the other workers drop their share when next asked (state, status, metrics)
        self.evictions += 1
        self.recent.appendleft({"model": victim, "bytes": held, "for": loading, "time_ns": time.time_ns(),
                                "unload_secs": round(time.monotonic() - started, 3)})

    def forget_unloaded(self) -> None:
        """Models unloaded through the API (or lost, or evicted) leave this process's accounting."""
        routes = self._repository.routes
        for name in [n for n in self.resident if not (n in routes and routes[n].ready_versions)]:
            self.resident.pop(name)

    # -- host handlers: this process's share, for the worker that decides ---------------------------------
    def _state(self, _args: dict[str, Any]) -> dict[str, Any]:
        """``budget.state``: what this process holds, for a decision (plain data)."""
        self.forget_unloaded()
        loaded = [n for n, h in self._repository.routes.items() if h.ready_versions and n not in self.pinned]
        return {"pinned_bytes": self.pinned_bytes, "draining": self.draining_bytes(),
                "pinned": sorted(self.pinned), "resident": dict(self.resident),
                "footprint": dict(self.footprint), "last_used": dict(self.last_used),
                "busy": [n for n in loaded if self._busy(n)],
                "unmeasured": [n for n in loaded if n not in self.resident]}

    def _measure_share(self, args: dict[str, Any]) -> int:
        """``budget.measure``: ``before`` a load, give back what evictions freed and remember this process's
        bytes; ``after`` it, record the growth as this process's share of the model and return it (a
        reload keeps at least the old share, whose version may be freed meanwhile, and counts the old share as
        draining until its model actor has drained and unloaded it)."""
        name = args["name"]
        if args["phase"] == "before":
            self.forget_unloaded()
            self._release()  # what the evicted models freed really leaves the process
            self._before[name] = self._measure()
            return 0
        before = self._before.pop(name, None)
        if before is None:  # this worker started during the load: it loaded the model from the journal
            return 0
        old = self.resident.get(name, 0)
        grown = max(self._measure() - before, old)
        self.footprint[name] = self.resident[name] = grown
        if old:
            key = next(self._drain_keys)
            self.draining[key] = (name, old)
            self._settled(name).link(lambda _r: self.draining.pop(key, None))
        return grown

    def _settled(self, name: str) -> Reply[None]:
        return self._repository.ref.settled(name)

    def status(self) -> dict[str, Any]:
        """The status page's part: resident set in LRU order (least recent first), last evictions."""
        self.forget_unloaded()
        now = self._clock()
        order = sorted(self.resident, key=lambda n: self.last_used.get(n, 0.0))
        return {"limit": self.limit, "used": self.used(), "pinned_bytes": self.pinned_bytes,
                "draining_bytes": self.draining_bytes(),
                "loads": self.loads, "evictions": self.evictions, "refusals": self.refusals,
                "lru": [{"model": n, "bytes": self.resident[n], "idle_secs": round(now - self.last_used.get(n, now), 3),
                         "load_secs": round(self.load_secs.get(n, 0.0), 3)} for n in order],
                "pinned": sorted(self.pinned), "recent_evictions": list(self.recent)}


def merge_status(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's :meth:`MemoryBudget.status` → the host's: bytes and counts added up, a model's
    idle time the shortest of any worker's, the evictions of every worker newest first."""
    if len(parts) == 1:
        return parts[0]
    lru: dict[str, dict[str, Any]] = {}
    for part in parts:
        for e in part["lru"]:
            m = lru.setdefault(e["model"], {**e, "bytes": 0})
            m["bytes"] += e["bytes"]
            m["idle_secs"] = min(m["idle_secs"], e["idle_secs"])
            m["load_secs"] = max(m["load_secs"], e["load_secs"])
    recent = sorted((e for part in parts for e in part["recent_evictions"]), key=lambda e: -e["time_ns"])
    return {"limit": parts[0]["limit"], **{k: sum(p.get(k, 0) for p in parts) for k in
                                          ("used", "pinned_bytes", "draining_bytes", "loads", "evictions", "refusals")},
            "lru": sorted(lru.values(), key=lambda e: -e["idle_secs"]), "pinned": parts[0]["pinned"],
            "recent_evictions": recent[:RECENT], "workers": len(parts)}


def on_disk(repositories: list[Path], name: str) -> int:
    """Bytes of the model's files: the estimate of a model never measured."""
    total = 0
    for repo in repositories:
        folder = repo / name
        if folder.is_dir():
            total += sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return total


def families(on_demand_loads: int, budget: MemoryBudget | None) -> list[dict[str, Any]]:
    """Our own metric families, in the custom families' shape (host/metrics_snapshot.py)."""
    out = [_family("nv_model_load_on_demand_total", "Number of model loads started by a request", "counter",
                   [({}, on_demand_loads)])]
    if budget is None:
        return out
    budget.forget_unloaded()
    return [*out,
            _family("nv_model_memory_evictions_total", "Number of models unloaded to make room in the memory budget",
                    "counter", [({}, budget.evictions)]),
            _family("nv_model_memory_refusals_total", "Number of loads refused by the memory budget", "counter",
                    [({}, budget.refusals)]),
            # each worker's share: the sum over workers is the host's
            _family("nv_model_memory_resident_bytes", "Measured host memory of each loaded model, in bytes", "gauge",
                    [({"model": n}, b) for n, b in sorted(budget.resident.items())]),
            _family("nv_model_memory_budget_used_bytes", "Host memory the loaded models hold, in bytes", "gauge",
                    [({}, budget.used())]),
            _family("nv_model_memory_budget_limit_bytes", "The model memory budget, in bytes", "gauge",
                    [({}, budget.limit)], merge="max")]  # every worker's is the host's: not added up


def _family(name: str, description: str, kind: str, series: list[tuple[dict[str, str], float]],
            merge: str = "sum") -> dict[str, Any]:
    """``merge``: how the workers' series add up into the host's (metrics/families.py ``merge_custom``)."""
    return {"name": name, "description": description, "kind": kind,
            "series": [{"labels": labels, "value": value} for labels, value in series],
            **({"merge": merge} if merge != "sum" else {})}

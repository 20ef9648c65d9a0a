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
the API leaves the accounting at the next decision. One process only: with ``--workers`` the command
line refuses a budget (each worker would decide alone about models that every worker loads).
Owner: the data plane; everything runs in hub greenlets.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.lock

from ..actors.repository.actor import RepositoryActor
from ..errors import TritonError
from ..host.base import Host
from ..runtime.process_memory import release_free_memory, return_large_frees, tree_bytes

log = logging.getLogger(__name__)
RECENT = 20  # evictions the status page lists
# added to a never-measured model's files: what an instance holds beside its weights (its thread, module,
# Python objects; about 2 MiB measured for a numpy model), so the first load is not under-estimated
FIRST_LOAD_SLACK = 4 << 20


class MemoryBudget:
    """Which models hold how much memory, in which order they were last used, and the load decisions."""

    def __init__(self, limit: int, repository: RepositoryActor, host: Host,
                 measure: Callable[[], int] = lambda: tree_bytes(unique=True),
                 release: Callable[[], None] = release_free_memory) -> None:
        self.limit = limit
        self.slack = FIRST_LOAD_SLACK
        self._repository = repository
        self._host = host
        self._measure = measure
        self._release = release  # after an eviction: what the model freed really leaves the process
        return_large_frees()  # a model's arrays go back to the system when it is unloaded
        self._lock = gevent.lock.Semaphore()  # one load or eviction at a time: deltas stay one model's
        self._clock = gevent.get_hub().loop.now  # cached loop time: no system call per request
        self.last_used: dict[str, float] = {}
        self.resident: dict[str, int] = {}  # loaded models → measured bytes
        self.footprint: dict[str, int] = {}  # every model measured so far → its last measure (the estimate)
        self.load_secs: dict[str, float] = {}
        self.pinned: set[str] = set()
        self.pinned_bytes = 0
        self.loads = 0
        self.evictions = 0
        self.refusals = 0
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT)

    def touch(self, name: str) -> None:
        self.last_used[name] = self._clock()

    def pin(self, names: list[str], held: int) -> None:
        """The startup models: never evicted; ``held`` bytes (their measured load) kept out of the budget."""
        self.pinned.update(names)
        self.pinned_bytes = max(held, 0)
        log.info("memory budget: %d bytes; %d pinned model(s) hold %d bytes", self.limit, len(names), held)

    def used(self) -> int:
        return self.pinned_bytes + sum(self.resident.values())

    def load(self, name: str, do_load: Callable[[], None]) -> None:
        """Make room for ``name`` and run ``do_load`` (the load API's host call), measuring what it added;
        raises UNAVAILABLE when it cannot fit."""
        with self._lock:
            self._forget_unloaded()
            need = self.footprint.get(name) or on_disk(self._repository.repositories, name) + self.slack
            if need > self.limit - self.pinned_bytes:
                self.refusals += 1
                log.warning("memory budget: refused '%s': needs %d bytes, budget %d (%d held by pinned models)",
                            name, need, self.limit, self.pinned_bytes)
                raise TritonError.unavailable(
                    f"failed to load '{name}': it needs about {need} bytes, more than the model memory budget of "
                    f"{self.limit} bytes leaves beside the pinned models ({self.pinned_bytes} bytes; "
                    f"{self.used()} used now)")
            was = self.resident.pop(name, 0)  # a reload: the old version goes once the new one serves
            self._make_room(name, need)
            before, started = self._measure(), time.monotonic()
            try:
                do_load()
            except BaseException:
                if was:
                    self.resident[name] = was
                raise
            after = self._measure()
            grown = max(after - before, was)
            self.loads += 1
            self.footprint[name] = self.resident[name] = grown
            self.load_secs[name] = time.monotonic() - started
            self.touch(name)
            log.info("memory budget: loaded '%s' in %.2fs: %d bytes measured (%d estimated); %d of %d used",
                     name, self.load_secs[name], grown, need, self.used(), self.limit)
            if self.used() > self.limit:  # the estimate was low: the others make room now
                try:
                    self._make_room(name, 0)
                except TritonError as e:
                    log.warning("memory budget: over by %d bytes after loading '%s': %s",
                                self.used() - self.limit, name, e.message)

    def _make_room(self, name: str, need: int) -> None:
        while self.used() + need > self.limit:
            victim = self._victim(name)
            if victim is None:
                self.refusals += 1
                log.warning("memory budget: refused '%s': %d of %d bytes used, %d needed, nothing evictable",
                            name, self.used(), self.limit, need)
                raise TritonError.unavailable(
                    f"failed to load '{name}': model memory budget exhausted: {self.used()} of {self.limit} bytes "
                    f"used ({self.pinned_bytes} by pinned models), about {need} needed, and no loaded model can be "
                    "unloaded")
            self._evict(victim, name)

    def _victim(self, loading: str) -> str | None:
        """The least recently used model that is resident, unpinned and idle; when every one is serving,
        the least recently used of them (its unload waits for its requests: refusing the load instead
        would fail a request only because the others were busy at that instant)."""
        order = [n for n in sorted(self.resident, key=lambda n: self.last_used.get(n, 0.0))
                 if n != loading and n not in self.pinned]
        return next((n for n in order if not self._busy(n)), order[0] if order else None)

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

    def _evict(self, victim: str, loading: str) -> None:
        held = self.resident[victim]
        log.info("memory budget: evicting '%s' (%d bytes, least recently used%s) to load '%s'",
                 victim, held, ", waiting for its requests" if self._busy(victim) else ", idle", loading)
        started = time.monotonic()
        self._host.broadcast("model.unload", {"name": victim, "unload_dependents": True, "wait": True,
                                               "demand": True})
        self._release()
        self.resident.pop(victim, None)
        self.evictions += 1
        self.recent.appendleft({"model": victim, "bytes": held, "for": loading, "time_ns": time.time_ns(),
                                "unload_secs": round(time.monotonic() - started, 3)})

    def _forget_unloaded(self) -> None:
        """Models unloaded through the API (or lost) leave the accounting."""
        routes = self._repository.routes
        for name in [n for n in self.resident if not (n in routes and routes[n].ready_versions)]:
            self.resident.pop(name)

    def status(self) -> dict[str, Any]:
        """The status page's part: resident set in LRU order (least recent first), last evictions."""
        now = self._clock()
        order = sorted(self.resident, key=lambda n: self.last_used.get(n, 0.0))
        return {"limit": self.limit, "used": self.used(), "pinned_bytes": self.pinned_bytes,
                "loads": self.loads, "evictions": self.evictions, "refusals": self.refusals,
                "lru": [{"model": n, "bytes": self.resident[n], "idle_secs": round(now - self.last_used.get(n, now), 3),
                         "load_secs": round(self.load_secs.get(n, 0.0), 3)} for n in order],
                "pinned": sorted(self.pinned), "recent_evictions": list(self.recent)}


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
    return [*out,
            _family("nv_model_memory_evictions_total", "Number of models unloaded to make room in the memory budget",
                    "counter", [({}, budget.evictions)]),
            _family("nv_model_memory_refusals_total", "Number of loads refused by the memory budget", "counter",
                    [({}, budget.refusals)]),
            _family("nv_model_memory_resident_bytes", "Measured host memory of each loaded model, in bytes", "gauge",
                    [({"model": n}, b) for n, b in sorted(budget.resident.items())]),
            _family("nv_model_memory_budget_used_bytes", "Host memory the loaded models hold, in bytes", "gauge",
                    [({}, budget.used())]),
            _family("nv_model_memory_budget_limit_bytes", "The model memory budget, in bytes", "gauge",
                    [({}, budget.limit)])]


def _family(name: str, description: str, kind: str, series: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    return {"name": name, "description": description, "kind": kind,
            "series": [{"labels": labels, "value": value} for labels, value in series]}

"""Who waits for whom among BLS calls, so that a call that could never be answered fails instead of hanging.

Triton hangs when a model calls itself with no free instance, or when two models call each other and
each holds its only instance (https://github.com/triton-inference-server/server/issues/6236, https://github.com/triton-inference-server/server/issues/8358; the python backend's docs only say "avoid cycles"). Here
every BLS call made from an instance thread is recorded as "this instance waits for that model
version" before it is queued, and refused if that version can never free an instance for it.

A version *makes progress* when one of its instances is idle, running without waiting on BLS, or
waiting only on versions that make progress; a version whose every instance waits, through a chain of
calls, on itself does not. The check walks that graph (tiny: one node per waiting instance). It is
per version, not per request: a request already dispatched to an instance whose own call is stuck is
not seen (that instance is waiting too, so the next call in the cycle is refused, which breaks it).

An ensemble has no instances: it makes progress when the composing versions its request still needs
do (:class:`Composite`, ``actors/scheduling/ensemble.py``), so a model calling an ensemble that runs that same
model, directly, through a nested ensemble or through a step that calls back by BLS, is refused as
a direct cycle is (before, the ensemble counted as "not ours" and the caller hung for good, its
version stuck UNLOADING on unload). A new request needs every step; a request in flight only the
steps it has not finished, so a call that waits on a run already past the busy model is not refused.
A version waited on through requests in flight is stuck only if every one of them is (the graph
does not know which request a caller waits for): that may miss a cycle, never invents one. A step
after a decoupled step counts as needed though it runs once per response, possibly never.

Owner: :class:`~.calls_from_models.ServerCalls`; touched only in the hub thread (no locks). Instances are
found through their native workers' tags (``(model, version)``, set by ``actors/scheduling/instance.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..runtime.bridge import NativeWorker, workers_tagged

VersionKey = tuple[str, int]


class Composite(Protocol):
    """A version served by calls to other versions (an ensemble's scheduler), read in the hub thread."""

    def needs(self) -> Iterable[VersionKey]:
        """The versions a new request will call."""
        ...

    def runs_need(self) -> list[set[VersionKey]]:
        """For each request in flight, the versions it still calls (running or not started)."""
        ...


def _no_composites(_version: VersionKey) -> Composite | None:
    return None


class WaitGraph:
    """The BLS calls in flight from instance threads, by calling worker."""

    def __init__(self, instances_of: Callable[[VersionKey], list[Any]] = workers_tagged,
                 composite_of: Callable[[VersionKey], Composite | None] = _no_composites) -> None:
        # ``instances_of(version)``: the workers (anything with ``busy``) that serve ``version``;
        # ``composite_of(version)``: the ensemble scheduler of ``version``, None for other versions
        self._instances_of = instances_of
        self._composite_of = composite_of
        self._waits: dict[NativeWorker[Any], list[VersionKey]] = {}

    def enter(self, worker: NativeWorker[Any], target: VersionKey) -> bool:
        """Record that ``worker`` waits for ``target``; False (nothing recorded) if it never could be served."""
        self._waits.setdefault(worker, []).append(target)
        if self._stuck(target, set(), fresh=True):
            self.leave(worker, target)
            return False
        return True

    def leave(self, worker: NativeWorker[Any], target: VersionKey) -> None:
        waits = self._waits.get(worker)
        if waits is None:
            return
        waits.remove(target)
        if not waits:
            del self._waits[worker]

    def _stuck(self, version: VersionKey, path: set[VersionKey], fresh: bool = False) -> bool:
        """True if no instance of ``version`` will ever be free, given the waits recorded now; for an
        ensemble, if the request (``fresh``: a new one, else every one in flight) never finishes."""
        instances = self._instances_of(version)
        composite = None if instances else self._composite_of(version)
        if not instances and composite is None:
            return False  # not served by instances of ours (a remote, an unknown version...): not our cycle
        if version in path:
            return True
        path.add(version)
        try:
            if composite is not None:
                return self._composite_stuck(composite, path, fresh)
            for worker in instances:
                targets = self._waits.get(worker)
                if not targets or not worker.busy:
                    return False  # idle, or running without waiting: it will be free
                if not any(self._stuck(t, path) for t in targets):
                    return False  # everything it waits for makes progress
            return True
        finally:
            path.discard(version)

    def _composite_stuck(self, composite: Composite, path: set[VersionKey], fresh: bool) -> bool:
        """An ensemble's request finishes only if every version it still calls makes progress."""
        if fresh:
            return any(self._stuck(v, path, fresh=True) for v in composite.needs())
        runs = composite.runs_need()
        return bool(runs) and all(any(self._stuck(v, path) for v in need) for need in runs)

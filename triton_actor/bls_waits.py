"""Who waits for whom among BLS calls, so that a call that could never be answered fails instead of hanging.

Triton hangs when a model calls itself with no free instance, or when two models call each other and
each holds its only instance (spec §9 #10, #13; the python backend's docs only say "avoid cycles"). Here
every BLS call made from an instance thread is recorded as "this instance waits for that model
version" before it is queued, and refused if that version can never free an instance for it.

A version *makes progress* when one of its instances is idle, running without waiting on BLS, or
waiting only on versions that make progress; a version whose every instance waits, through a chain of
calls, on itself does not. The check walks that graph (tiny: one node per waiting instance). It is
per version, not per request: a request already dispatched to an instance whose own call is stuck is
not seen (that instance is waiting too, so the next call in the cycle is refused, which breaks it).

Owner: :class:`~.server_calls.ServerCalls`; touched only in the hub thread (no locks). Instances are
found through their native workers' tags (``(model, version)``, set by ``actors/instance.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .actors.bridge import NativeWorker, workers_tagged

VersionKey = tuple[str, int]


class WaitGraph:
    """The BLS calls in flight from instance threads, by calling worker."""

    def __init__(self, instances_of: Callable[[VersionKey], list[Any]] = workers_tagged) -> None:
        # ``instances_of(version)``: the workers (anything with ``busy``) that serve ``version``
        self._instances_of = instances_of
        self._waits: dict[NativeWorker[Any], list[VersionKey]] = {}

    def enter(self, worker: NativeWorker[Any], target: VersionKey) -> bool:
        """Record that ``worker`` waits for ``target``; False (nothing recorded) if it never could be served."""
        self._waits.setdefault(worker, []).append(target)
        if self._stuck(target, set()):
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

    def _stuck(self, version: VersionKey, path: set[VersionKey]) -> bool:
        """True if no instance of ``version`` will ever be free, given the waits recorded now."""
        instances = self._instances_of(version)
        if not instances:
            return False  # not served by instances of ours (an ensemble, a remote...): not our cycle
        if version in path:
            return True
        path.add(version)
        try:
            for worker in instances:
                targets = self._waits.get(worker)
                if not targets or not worker.busy:
                    return False  # idle, or running without waiting: it will be free
                if not any(self._stuck(t, path) for t in targets):
                    return False  # everything it waits for makes progress
            return True
        finally:
            path.discard(version)

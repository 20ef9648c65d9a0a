"""What the routing table holds: immutable snapshots of a model and its versions, their ready states, and
the repository index they show (:func:`index_entries`).

A model actor builds a new :class:`ModelHandle` after every change and the repository actor swaps it
into its routing table; front ends route requests through handles with no round trip to an actor.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import TritonError
from ...inference import InferRequest, InferResponse
from ...repository.config import ModelConfig
from ...runtime import fastpath
from ...runtime.kernel import Reply
from ..scheduling.scheduler import Enqueue, GetStats, GetStatus, SchedulerActor
from .validation import RequestValidator

assert Enqueue._fields == ("request", "batch_size", "reply", "start_ns")  # the order new_tuple fills


class ReadyState(str, enum.Enum):
    """Triton's model version ready states (``ModelReadyState``). ``str``-valued: each member equals
    its name as a string, and the index writes ``.value``, the strings Triton's clients read."""

    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"

    def __str__(self) -> str:
        return self.value


UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE = (ReadyState.UNKNOWN, ReadyState.LOADING, ReadyState.READY,
                                                  ReadyState.UNLOADING, ReadyState.UNAVAILABLE)

# The life of one version record (owned by its ModelActor; ``Version.to`` is the one place that changes a
# state, and it checks this table). A record is born UNKNOWN; a state may always be kept with a new reason.
#   UNKNOWN     → LOADING      the load of this version starts
#   UNKNOWN     → UNAVAILABLE  nothing to load (a config that fails before versions are known)
#   LOADING     → READY        every instance loaded and warmed up, the scheduler runs
#   LOADING     → UNAVAILABLE  the load failed (the reason says why) or was interrupted
#   READY       → UNLOADING    unload requested: no new request is routed, in-flight ones finish
#   READY       → UNAVAILABLE  the supervisor gave up on the model (ModelActor failed past its budget), or
#                              every instance of the version is DOWN (the scheduler's event, VersionDown)
#   UNLOADING   → UNAVAILABLE  drained and finalized ("unloaded")
#   UNAVAILABLE → LOADING      loaded again
# A reload does not move a READY record: the new version gets a record of its own, swapped in when READY.
TRANSITIONS: dict[ReadyState, frozenset[ReadyState]] = {
    UNKNOWN: frozenset({LOADING, UNAVAILABLE}),
    LOADING: frozenset({READY, UNAVAILABLE}),
    READY: frozenset({UNLOADING, UNAVAILABLE}),
    UNLOADING: frozenset({UNAVAILABLE}),
    UNAVAILABLE: frozenset({LOADING}),
}


class IllegalTransition(AssertionError):
    """A version moved along no edge of :data:`TRANSITIONS`: a bug of ours. Not a TritonError, so a
    handler that treats TritonErrors as expected load failures lets it reach the supervisor."""


def check_transition(old: ReadyState, new: ReadyState) -> ReadyState:
    """``new`` if a version may go from ``old`` to it (or stays in ``old``), else :class:`IllegalTransition`."""
    if new is not old and new not in TRANSITIONS[old]:
        raise IllegalTransition(f"illegal ready state transition {old.value} → {new.value}")
    return new


@dataclass(frozen=True, slots=True)
class VersionHandle:
    """One version as the routing table shows it."""

    version: int
    state: ReadyState
    reason: str = ""
    scheduler: SchedulerActor | None = None
    validator: RequestValidator | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        """Validate and queue (caller's greenlet). The reply completes when the model answered."""
        assert self.validator is not None and self.scheduler is not None
        batch = self.validator.check(request)
        reply: Reply[InferResponse] = Reply()
        item = fastpath.new_tuple(Enqueue, (request, batch, reply, time.perf_counter_ns()))  # (no generated __new__)
        scheduler = self.scheduler
        if not scheduler.direct(item):  # run now on this stack where the scheduler allows (a fast path)
            scheduler.ref.tell(item)
        return reply

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        """Queue a request its caller checked with :attr:`validator` (``batch``: what the check gave),
        answering ``reply`` (caller's greenlet; an ensemble step, ``scheduling/ensemble_step.py``)."""
        assert self.scheduler is not None
        item = Enqueue(request, batch, reply, time.perf_counter_ns())
        scheduler = self.scheduler
        if not scheduler.direct(item):
            scheduler.ref.tell(item)

    def step_runner(self) -> Any:
        """What runs an ensemble chain's step on the caller's stack (the scheduler's ``step_direct``), or
        None where a step must be enqueued: a version behind the response cache (the cache answers it), a
        scheduler without one (the sequence batcher, a nested ensemble)."""
        return getattr(self.scheduler, "step_direct", None)

    def statistics(self) -> dict[str, object]:
        assert self.scheduler is not None
        return self.scheduler.ref.ask(GetStats(), timeout=30)

    def live_status(self) -> dict[str, object]:
        """Statistics plus queue depth, running requests and instances (the status page)."""
        assert self.scheduler is not None
        return self.scheduler.ref.ask(GetStatus(), timeout=30)


@dataclass(frozen=True, slots=True)
class CachedVersionHandle(VersionHandle):
    """A version whose answers go through the response cache (``cached.py``): only these pay for it."""

    cache: Any = None  # its CachedVersion

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        """Validate, then look up; a miss is queued as by :meth:`VersionHandle.infer` (caller's greenlet)."""
        assert self.validator is not None
        return self.cache.infer(request, self.validator.check(request))

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        """As :meth:`VersionHandle.enqueue`, through the cache: a hit answers ``reply`` at once."""
        self.cache.infer(request, batch, reply)

    def step_runner(self) -> Any:
        return None  # a step goes through the cache (enqueue)


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """Immutable snapshot of one model, swapped in by its actor on every change."""

    name: str
    config: ModelConfig | None
    versions: dict[int, VersionHandle]
    ready_versions: tuple[int, ...]  # ascending

    def resolve(self, version: int) -> VersionHandle:
        """The version that serves ``version`` (-1: highest READY), with Triton's errors (docs/compatibility.md lists where they differ)."""
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


def index_entries(names: list[str], routes: Mapping[str, ModelHandle], ready_only: bool) -> list[dict[str, Any]]:
    """The repository index (Triton's ``RepositoryIndex``) of ``names`` as the routing table shows them: a
    model with no handle is listed by name alone, one with no versions as a duplicate name."""
    entries: list[dict[str, Any]] = []
    for name in names:
        handle = routes.get(name)
        if handle is None or not handle.versions:
            if not ready_only:
                entries.append({"name": name} if handle is None else
                               {"name": name, "state": UNAVAILABLE.value, "reason": "duplicate model name"})
            continue
        for v, vh in handle.versions.items():
            if ready_only and vh.state != READY:
                continue
            entry: dict[str, Any] = {"name": name}
            if v >= 0:
                entry["version"] = str(v)
            entry["state"] = vh.state.value  # the plain string, for JSON and protobuf alike
            if vh.reason:
                entry["reason"] = vh.reason
            entries.append(entry)
    return entries

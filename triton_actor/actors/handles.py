"""What the routing table holds: immutable snapshots of a model and its versions.

A model actor builds a new :class:`ModelHandle` after every change and the repository actor swaps it
into its routing table; front ends route requests through handles with no round trip to an actor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..repository.config import ModelConfig
from ..validation import RequestValidator
from .kernel import Reply
from .scheduler import Enqueue, GetStats, SchedulerActor

UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE = "UNKNOWN", "LOADING", "READY", "UNLOADING", "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class VersionHandle:
    """One version as the routing table shows it."""

    version: int
    state: str
    reason: str = ""
    scheduler: SchedulerActor | None = None
    validator: RequestValidator | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        """Validate and queue (caller's greenlet). The reply completes when the model answered."""
        assert self.validator is not None and self.scheduler is not None
        batch = self.validator.check(request)
        reply: Reply[InferResponse] = Reply()
        self.scheduler.ref.tell(Enqueue(request, batch, reply, time.perf_counter_ns()))
        return reply

    def statistics(self) -> dict[str, object]:
        assert self.scheduler is not None
        return self.scheduler.ref.ask(GetStats(), timeout=30)


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """Immutable snapshot of one model, swapped in by its actor on every change."""

    name: str
    config: ModelConfig | None
    versions: dict[int, VersionHandle]
    ready_versions: tuple[int, ...]  # ascending

    def resolve(self, version: int) -> VersionHandle:
        """The version that serves ``version`` (-1: highest READY), with Triton's errors (spec §1.2)."""
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

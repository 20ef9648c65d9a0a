"""The state of one ensemble request in flight, and the messages its steps send back to the scheduler.

Owned by :class:`~.ensemble.EnsembleScheduler` (split from it so the scheduler module keeps to its
behaviour): a request (:class:`_Run`), its tensor tables (:class:`_Table`: the request's own and the
forks that the responses of a decoupled step make), and the two messages a step answers with
(:class:`_StepAnswered` from the hub, :class:`_StepStreamed` from a decoupled step's reader greenlet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.lock

from ...inference import InferInput, InferResponse
from ...repository.ensemble_graph import Step
from ...runtime.kernel import Reply
from .scheduler import Enqueue


@dataclass(eq=False, slots=True)
class _Table:
    """One set of ensemble tensors moving through the graph: the request's own, or a fork made by one
    response of a decoupled step (``parent`` then shares the outputs of its plain steps still running)."""

    tensors: dict[str, InferInput]
    started: set[int]
    parent: _Table | None = None
    children: list[_Table] = field(default_factory=list)
    plain: int = 0  # steps in flight that answer once
    queued: int = 0  # steps ready but not started yet (waiting for a later hub turn)
    streams: int = 0  # decoupled steps in flight
    running: set[int] = field(default_factory=set)  # indices of its steps in flight (for the BLS wait graph)
    settled: bool = False
    release: Callable[[], Any] | None = None  # frees the max_inflight slot this fork holds
    at: int = -1  # a chain's step in flight (ensemble_chain.py); -1: the data flow runs the table


@dataclass(eq=False, slots=True)
class _Run:
    """One ensemble request in flight."""

    msg: Enqueue
    decoupled: Any  # the request's ResponseChannel when the ensemble streams, else None
    open_tables: int = 0
    answered: int = 0
    timings: list[tuple[int, int, int, int]] = field(default_factory=list)  # each step's queue and compute ns
    failed: bool = False
    readers: list[gevent.Greenlet] = field(default_factory=list)
    tables: list[_Table] = field(default_factory=list)  # every table, so a failure frees all tensors at once
    gates: dict[int, gevent.lock.Semaphore] = field(default_factory=dict)
    trace: Any = None  # OpenTelemetry: the SpanTrace its steps' traces are spawned from (observability/otel.py)
    span: Any = None  # and the ensemble's model span, ended with the run


@dataclass(frozen=True, slots=True)
class _StepAnswered:
    run: _Run
    table: _Table
    step: Step
    reply: Reply[InferResponse]


@dataclass(frozen=True, slots=True)
class _StepStreamed:
    run: _Run
    table: _Table
    step: Step
    item: Any  # InferResponse, an error, or None (a flags-only final)
    final: bool
    gate: gevent.lock.Semaphore | None

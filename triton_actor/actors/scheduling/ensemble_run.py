"""The state of one ensemble request in flight, and the messages its steps send back to the scheduler.

Owned by :class:`~.ensemble.EnsembleScheduler` (split from it so the scheduler module keeps to its
behaviour): a request (:class:`_Run`), its tensor tables (:class:`_Table`: the request's own and the
forks that the responses of a decoupled step make), and the two messages a step answers with
(:class:`_StepAnswered` from the hub, :class:`_StepStreamed` from a decoupled step's reader greenlet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.lock

from ...inference import InferInput, InferResponse
from ...repository.ensemble_graph import Step
from ...runtime.kernel import Reply
from .scheduler import Enqueue


class _Table:
    """One set of ensemble tensors moving through the graph: the request's own, or a fork made by one
    response of a decoupled step (``parent`` then shares the outputs of its plain steps still running).
    Its ``__init__`` is written out: the dataclass one with its default factories ran about twice the
    bytecodes, for every ensemble request."""

    __slots__ = ("tensors", "started", "parent", "children", "plain", "queued", "streams", "running", "settled",
                 "release", "at")

    def __init__(self, tensors: dict[str, InferInput], started: set[int], parent: _Table | None = None,
                 release: Callable[[], Any] | None = None) -> None:
        self.tensors = tensors
        self.started = started
        self.parent = parent
        self.children: list[_Table] = []
        self.plain = 0  # steps in flight that answer once
        self.queued = 0  # steps ready but not started yet (waiting for a later hub turn)
        self.streams = 0  # decoupled steps in flight
        self.running: set[int] = set()  # indices of its steps in flight (for the BLS wait graph)
        self.settled = False
        self.release = release  # frees the max_inflight slot this fork holds
        self.at = -1  # a chain's step in flight (ensemble_chain.py); -1: the data flow runs the table


class _Run:
    """One ensemble request in flight (``__init__`` written out, as :class:`_Table`'s)."""

    __slots__ = ("msg", "decoupled", "open_tables", "answered", "final_sent", "timings", "failed", "readers", "tables",
                 "gates", "trace", "span")

    def __init__(self, msg: Enqueue, decoupled: Any) -> None:
        self.msg = msg
        self.decoupled = decoupled  # the request's ResponseChannel when the ensemble streams, else None
        self.open_tables = 0
        self.answered = 0
        self.final_sent = False  # a streamed response carried the final flag (no step was in flight any more)
        self.timings: list[tuple[int, int, int, int]] = []  # each step's queue and compute ns
        self.failed = False
        self.readers: list[gevent.Greenlet] = []
        self.tables: list[_Table] = []  # every table, so a failure frees all tensors at once
        self.gates: dict[int, gevent.lock.Semaphore] = {}
        self.trace: Any = None  # OpenTelemetry: the SpanTrace its steps' traces are spawned from (observability/otel.py)
        self.span: Any = None  # and the ensemble's model span, ended with the run


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

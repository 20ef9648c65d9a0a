"""The messages every scheduler of a model version handles: the default and dynamic batcher
(:mod:`.scheduler`), the sequence batcher (:mod:`.sequence_scheduler`) and the ensemble (:mod:`.ensemble`).
A :class:`~..model.handles.VersionHandle` and the version's lifecycle (:mod:`..model.version`) send them the same way
whichever scheduler the version has.

:class:`Enqueue` (tell, carries its Reply), :class:`Drain` (tell, carries its Reply: completed once nothing
is queued or running), :class:`GetStats` and :class:`GetStatus` (asks). Frozen, slotted, no behaviour;
:class:`Enqueue` is a named tuple (one per request and per ensemble step: a frozen dataclass's ``__init__``
ran four ``object.__setattr__`` calls in Python for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...inference import InferRequest, InferResponse
from ...runtime.kernel import Reply


class Enqueue(NamedTuple):
    """One request: ``start_ns`` is when it arrived (its latency and queue time count from there)."""

    request: InferRequest
    batch_size: int
    reply: Reply[InferResponse]
    start_ns: int


@dataclass(frozen=True, slots=True)
class GetStats:
    """The version's statistics snapshot (the statistics extension, the metrics)."""


@dataclass(frozen=True, slots=True)
class GetStatus:
    """The status page's view: the statistics snapshot plus the live queue and instances."""


@dataclass(frozen=True, slots=True)
class Drain:
    reply: Reply[None]

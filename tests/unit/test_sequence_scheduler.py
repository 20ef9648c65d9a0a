"""SequenceSchedulerActor (``triton_actor/actors/sequence_scheduler.py``) driven with fake instances
(``FakeInstance`` of test_scheduler.py: records each execution, completes it when the test says)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.unit.test_scheduler import WAIT, FakeInstance, _request
from triton_actor.actors import sequence_slots
from triton_actor.actors.kernel import Reply
from triton_actor.actors.scheduler_messages import Enqueue, GetStats
from triton_actor.actors.sequence_controls import SequenceTensors
from triton_actor.actors.sequence_scheduler import SequenceSchedulerActor
from triton_actor.actors.sequence_slots import SEQUENCE_START, SlotPolicy
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.statistics import VersionStats


class _Instance(FakeInstance):
    watches_cancellation = False  # the sequence batcher hands each request its cancellation probe


def _enqueue(sched: SequenceSchedulerActor, rid: str, corr_id: int, flags: int) -> Reply[InferResponse]:
    reply: Reply[InferResponse] = Reply()
    request = _request(rid)._replace(correlation_id=corr_id, flags=flags)
    sched.ref.tell(Enqueue(request, 1, reply, time.perf_counter_ns()))
    return reply


def _started() -> tuple[_Instance, VersionStats, SequenceSchedulerActor]:
    """A sequence batcher with one fake instance (one slot), started."""
    inst, stats = _Instance("inst0"), VersionStats("m", 1)
    tensors = SequenceTensors((), (), False, frozenset())
    sched = SequenceSchedulerActor("scheduler:m:1", "m", [inst], stats, SlotPolicy(), tensors)  # type: ignore[list-item]
    sched.start()
    return inst, stats, sched


@pytest.mark.timeout(30)
def test_a_full_queue_refuses_as_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sequence batcher's full queue counts REJECTED, as the dynamic batcher's does (Triton's reasons)."""
    monkeypatch.setattr(sequence_slots, "MAX_QUEUED", 1)
    inst, stats, sched = _started()
    try:
        first = _enqueue(sched, "s1", 1, SEQUENCE_START)  # runs
        _enqueue(sched, "s2", 2, SEQUENCE_START)  # waits for the slot
        refused = _enqueue(sched, "s3", 3, SEQUENCE_START)
        with pytest.raises(TritonError) as e:
            refused.get(timeout=WAIT)
        assert e.value.code == Code.UNAVAILABLE and e.value.message == "Exceeds maximum queue size"
        sched.ref.ask(GetStats(), timeout=WAIT)
        inst.complete(0, results=[InferResponse([("OUT", np.array([1]))], {})])
        first.get(timeout=WAIT)
        assert stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    finally:
        sched.stop(timeout=WAIT)


@pytest.mark.timeout(30)
def test_stats_count_the_requests_waiting_for_a_slot() -> None:
    """``pending`` (nv_inference_pending_request_count) for a sequence model: the sequence batcher's
    statistics had none, so the gauge read 0 while requests waited for a slot."""
    inst, _stats, sched = _started()
    try:
        first = _enqueue(sched, "s1", 1, SEQUENCE_START)  # runs
        _enqueue(sched, "s2", 2, SEQUENCE_START)  # waits for the one slot
        _enqueue(sched, "s3", 3, SEQUENCE_START)
        assert sched.ref.ask(GetStats(), timeout=WAIT)["pending"] == 2
        inst.complete(0, results=[InferResponse([("OUT", np.array([1]))], {})])
        first.get(timeout=WAIT)
    finally:
        sched.stop(timeout=WAIT)

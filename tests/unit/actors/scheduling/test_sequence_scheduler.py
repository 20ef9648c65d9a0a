"""SequenceSchedulerActor (``triton_actor/actors/scheduling/sequence_scheduler.py``) driven with fake instances
(``FakeInstance`` of test_scheduler.py: records each execution, completes it when the test says)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.actors.scheduling.test_scheduler import WAIT, FakeInstance, _request
from triton_actor.actors.scheduling import sequence_slots
from triton_actor.actors.scheduling.messages import Enqueue, GetStats
from triton_actor.actors.scheduling.sequence_controls import SequenceTensors
from triton_actor.actors.scheduling.sequence_scheduler import SequenceSchedulerActor
from triton_actor.actors.scheduling.sequence_slots import SEQUENCE_START, SlotPolicy
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.metrics.statistics import VersionStats
from triton_actor.runtime.kernel import Reply
from triton_actor.runtime.wake_timer import Wake


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


def _manual(instances: int = 1, slots: int = 1) -> tuple[list[_Instance], SequenceSchedulerActor, list[int]]:
    """A started sequence batcher on a manual clock (``clock[0]``, ns; the idle timeout is 1000 ns): the
    test moves time and tells ``Wake`` itself, as the timer would."""
    insts = [_Instance(f"inst{i}") for i in range(instances)]
    clock = [0]
    policy = SlotPolicy(instances=instances, slots=slots, max_batch_size=slots if slots > 1 else 0, idle_ns=1000)
    tensors = SequenceTensors((), (), False, frozenset())
    sched = SequenceSchedulerActor("scheduler:m:1", "m", insts, VersionStats("m", 1), policy, tensors,  # type: ignore[arg-type]
                                   clock=lambda: clock[0])
    sched.start()
    return insts, sched, clock


def _sync(sched: SequenceSchedulerActor) -> None:
    """Every message told before has been handled (the actor answers in order)."""
    sched.ref.ask(GetStats(), timeout=WAIT)


@pytest.mark.timeout(30)
def test_abandoned_starts_behind_an_idle_sequence_do_not_wedge_the_model() -> None:
    """One slot, held by a sequence that went idle; four STARTs queue behind it and their clients go away
    (ordinary client timeouts), then a live START comes. The idle release gives the slot to the first
    abandoned sequence, which is dropped, and the scheduler must go on until the live one runs."""
    (inst,), sched, clock = _manual()
    try:
        _enqueue(sched, "s1", 1, SEQUENCE_START)
        _sync(sched)
        inst.complete(0)  # s1 holds the slot, idle from now on
        gone = [_enqueue(sched, f"a{i}", 10 + i, SEQUENCE_START) for i in range(4)]
        for reply in gone:
            reply.fail(TritonError(Code.CANCELLED, "client went away"))
        live = _enqueue(sched, "live", 99, SEQUENCE_START | sequence_slots.SEQUENCE_END)
        _sync(sched)  # handled before the clock moves (the slow path handles them in its loop greenlet)
        clock[0] = 5000  # past s1's idle timeout
        sched.ref.tell(Wake(None))
        _sync(sched)
        assert [r.id for r in inst.calls[-1][0]] == ["live"], "the live sequence never ran"
        inst.complete(-1)
        live.get(timeout=WAIT)
    finally:
        sched.stop(timeout=WAIT)


# Few sequence ids, so that sequences meet on the slots; a cancel hits one of the latest requests (those
# still queued, most often).
_OPS = st.lists(st.tuples(st.sampled_from(["start", "start", "next", "end", "cancel", "cancel", "complete", "idle"]),
                          st.integers(0, 3)), max_size=40)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, shape=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]))
def test_no_runnable_request_waits_beside_an_idle_slot(ops: list[tuple[str, int]], shape: tuple[int, int]) -> None:
    """Random interleavings of starts, requests, ends, client cancellations, completions and idle
    timeouts: after every step, an instance with nothing running has no sequence with a queued request,
    and a sequence waits in the backlog only while every slot is held. At the end, with every batch
    completed and every sequence idle, nobody is left waiting."""
    insts, sched, clock = _manual(*shape)
    done_calls = {inst: 0 for inst in insts}
    replies: list[Reply[InferResponse]] = []
    try:
        for n, (op, k) in enumerate(ops):
            corr_id = k + 1
            if op in ("start", "next", "end"):
                flags = {"start": SEQUENCE_START, "next": 0, "end": sequence_slots.SEQUENCE_END}[op]
                replies.append(_enqueue(sched, f"r{n}", corr_id, flags))
            elif op == "cancel" and replies:
                reply = replies[-1 - k % len(replies)]
                if not reply.ready():
                    reply.fail(TritonError(Code.CANCELLED, "client went away"))
            elif op == "complete":
                inst = insts[k % len(insts)]
                if done_calls[inst] < len(inst.calls):
                    inst.complete(done_calls[inst])
                    done_calls[inst] += 1
            elif op == "idle":
                clock[0] += 600  # two of these pass the idle timeout
                sched.ref.tell(Wake(None))
            _sync(sched)
            _check_nothing_runnable_is_left(sched, insts, done_calls)
        for _ in range(len(ops) + 2):  # finish every batch; let every sequence go idle and release its slot
            for inst in insts:
                while done_calls[inst] < len(inst.calls):
                    inst.complete(done_calls[inst])
                    done_calls[inst] += 1
            _sync(sched)
            clock[0] += 2000
            sched.ref.tell(Wake(None))
            _sync(sched)
            _check_nothing_runnable_is_left(sched, insts, done_calls)
        assert all(reply.ready() for reply in replies), "a request waits though every slot is free"
    finally:
        sched.stop(timeout=WAIT)


def _check_nothing_runnable_is_left(sched: SequenceSchedulerActor, insts: list[_Instance],
                                    done_calls: dict[_Instance, int]) -> None:
    slots = sched._slots  # the policy's view: which sequence holds what, and what is queued
    for i, inst in enumerate(insts):
        if done_calls[inst] == len(inst.calls):  # nothing running there
            assert not slots.ready(i), f"instance {i} is idle while a sequence on it has a request queued"
    assert slots.backlog == 0 or slots.free == 0, "a sequence waits in the backlog beside a free slot"

"""SchedulerActor (``triton_actor/actors/scheduling/scheduler.py``) driven with fake instances.

A fake instance records each ``execute(requests, done)``; the test completes batches by calling ``done``
itself. An ``ask(GetStats())`` is the barrier that makes sure the scheduler has handled every message told
before it (one mailbox, FIFO, handlers never yield).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import gevent.event
import numpy as np
import pytest

from triton_actor.actors.scheduling.batch_queue import BatchPolicy, QueuePolicy
from triton_actor.actors.scheduling.instance import DOWN, RESTARTING, UP
from triton_actor.actors.scheduling.scheduler import Drain, Enqueue, GetStats, GetStatus, SchedulerActor
from triton_actor.backends.base import RESCHEDULE
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.metrics.statistics import VersionStats
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime import fastpath
from triton_actor.runtime.kernel import Reply

FP32 = BY_WIRE["FP32"]
WAIT = 5.0
TIMINGS = (0, 10, 0)


class FakeInstance:
    """Anything with ``.name`` and ``.execute(requests, done)``: records calls, completes when told."""

    observes_cancellation = False
    inline = False  # runs on its thread (InlineInstance: runs in the caller)

    def __init__(self, name: str) -> None:
        self.name = name
        self.health, self.reason = UP, ""
        self.watcher: Callable[[Any, str, str], None] | None = None
        self.calls: list[tuple[list[InferRequest], Callable[[bool, Any], None]]] = []
        self.called = gevent.event.Event()  # set by the first call

    def execute(self, requests: list[InferRequest], done: Callable[[bool, Any], None]) -> None:
        self.calls.append((list(requests), done))
        self.called.set()

    def complete(self, index: int = -1, results: list[Any] | None = None) -> list[InferRequest]:
        """Answer call ``index`` with one response per request (tagged with the request id)."""
        requests, done = self.calls[index]
        if results is None:
            results = [InferResponse([("OUT", np.array([len(r.id)]))], {"rid": r.id}) for r in requests]
        done(True, (results, TIMINGS))
        return requests

    def fail(self, index: int, error: BaseException) -> None:
        self.calls[index][1](False, error)

    def watch(self, watcher: Callable[[Any, str, str], None] | None) -> None:
        self.watcher = watcher

    def become(self, health: str, reason: str = "") -> None:
        """What ModelInstance does when its thread dies, restarts or gives up (actors/scheduling/instance.py)."""
        self.health, self.reason = health, reason
        assert self.watcher is not None
        self.watcher(self, health, reason)


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[SchedulerActor, list[FakeInstance], VersionStats]]]:
    started: list[SchedulerActor] = []
    downs = DOWNS
    downs.clear()

    def make(n_instances: int = 1, max_batch_size: int = 0, batching: bool = False, policy: BatchPolicy | None = None):
        instances = [FakeInstance(f"inst{i}") for i in range(n_instances)]
        stats = VersionStats("m", 1)
        if batching:
            policy = BatchPolicy(max_batch_size=max_batch_size, preferred=(max_batch_size,))
        sched = SchedulerActor("scheduler:m:1", instances, stats, policy, on_down=lambda s, r: downs.append((s, r)))  # type: ignore[arg-type]
        sched.start()
        started.append(sched)
        return sched, instances, stats

    yield make
    for sched in started:
        sched.stop(timeout=WAIT)


DOWNS: list[tuple[SchedulerActor, str]] = []  # on_down calls of the schedulers ``make`` made


def _request(rid: str, shape: tuple[int, ...] = (1, 4)) -> InferRequest:
    return InferRequest("m", 1, rid, {"INPUT0": InferInput("INPUT0", FP32, shape, np.zeros(shape, np.float32))})


def _enqueue(sched: SchedulerActor, rid: str, shape: tuple[int, ...] = (1, 4), batch: int | None = None,
             **fields: Any) -> Reply[Any]:
    reply: Reply[Any] = Reply()
    size = batch if batch is not None else shape[0]
    sched.ref.tell(Enqueue(_request(rid, shape)._replace(**fields), size, reply, time.perf_counter_ns()))
    return reply


def _sync(sched: SchedulerActor) -> dict[str, Any]:
    """Barrier: every message told before this one has been handled."""
    return sched.ref.ask(GetStats(), timeout=WAIT)


def _ids(requests: list[InferRequest]) -> list[str]:
    return [r.id for r in requests]


@pytest.mark.timeout(30)
def test_requests_queue_when_no_instance_is_idle(make) -> None:
    sched, [inst], _ = make(n_instances=1)
    replies = [_enqueue(sched, f"r{i}") for i in range(3)]
    _sync(sched)
    # backpressure: one instance, one execution at a time
    assert len(inst.calls) == 1
    assert _ids(inst.calls[0][0]) == ["r0"]
    assert not any(r.ready() for r in replies)
    inst.complete(0)
    assert replies[0].get(timeout=WAIT).parameters == {"rid": "r0"}
    _sync(sched)
    assert len(inst.calls) == 2 and _ids(inst.calls[1][0]) == ["r1"]  # no batching: one request per execution
    assert not replies[1].ready() and not replies[2].ready()
    inst.complete(1)
    _sync(sched)
    assert len(inst.calls) == 3 and _ids(inst.calls[2][0]) == ["r2"]
    inst.complete(2)
    assert [r.get(timeout=WAIT).parameters["rid"] for r in replies] == ["r0", "r1", "r2"]


@pytest.mark.timeout(30)
def test_two_instances_run_in_parallel(make) -> None:
    sched, instances, _ = make(n_instances=2)
    replies = [_enqueue(sched, f"r{i}") for i in range(3)]
    _sync(sched)
    assert [len(i.calls) for i in instances] == [1, 1]
    instances[1].complete(0)
    assert replies[1].get(timeout=WAIT).parameters == {"rid": "r1"}
    _sync(sched)
    # the instance that became idle takes the next request
    assert [len(i.calls) for i in instances] == [1, 2]
    assert _ids(instances[1].calls[1][0]) == ["r2"]


@pytest.mark.timeout(30)
def test_dynamic_batching_groups_same_shapes_up_to_max_batch_size(make) -> None:
    sched, [inst], _ = make(n_instances=1, max_batch_size=4, batching=True)
    first = _enqueue(sched, "first")  # runs alone: it is the only request queued
    same = [_enqueue(sched, f"s{i}") for i in range(5)]  # 5 x batch 1, same shape
    other = _enqueue(sched, "other", shape=(1, 8))  # a different shape never joins them
    _sync(sched)
    assert [_ids(c[0]) for c in inst.calls] == [["first"]]
    inst.complete(0)
    _sync(sched)
    assert _ids(inst.calls[1][0]) == ["s0", "s1", "s2", "s3"]  # capped at max_batch_size 4
    inst.complete(1)
    _sync(sched)
    assert _ids(inst.calls[2][0]) == ["s4"]  # the next one has another shape: batch ends here
    inst.complete(2)
    _sync(sched)
    assert _ids(inst.calls[3][0]) == ["other"]
    inst.complete(3)
    for reply, rid in zip([first, *same, other], ["first", "s0", "s1", "s2", "s3", "s4", "other"], strict=True):
        assert reply.get(timeout=WAIT).parameters == {"rid": rid}


@pytest.mark.timeout(30)
def test_dynamic_batching_counts_request_batch_sizes(make) -> None:
    sched, [inst], stats = make(n_instances=1, max_batch_size=8, batching=True)
    _enqueue(sched, "blocker", shape=(1, 4))
    _enqueue(sched, "a", shape=(3, 4))
    _enqueue(sched, "b", shape=(4, 4))
    _enqueue(sched, "c", shape=(2, 4))  # 3 + 4 + 2 > 8: c waits for the next batch
    _sync(sched)
    inst.complete(0)
    _sync(sched)
    assert _ids(inst.calls[1][0]) == ["a", "b"]
    inst.complete(1)
    _sync(sched)
    assert _ids(inst.calls[2][0]) == ["c"]
    inst.complete(2)
    snap = _sync(sched)
    assert snap["execution_count"] == 3
    assert snap["inference_count"] == 1 + 3 + 4 + 2
    assert set(snap["batches"]) == {1, 7, 2}
    assert stats.inference_count == 10


@pytest.mark.timeout(30)
def test_without_dynamic_batching_requests_never_share_an_execution(make) -> None:
    sched, [inst], _ = make(n_instances=1, max_batch_size=8, batching=False)
    for i in range(3):
        _enqueue(sched, f"r{i}")
    _sync(sched)
    inst.complete(0)
    _sync(sched)
    inst.complete(1)
    _sync(sched)
    assert [_ids(c[0]) for c in inst.calls] == [["r0"], ["r1"], ["r2"]]


@pytest.mark.timeout(30)
def test_stats_counters(make) -> None:
    sched, [inst], stats = make(n_instances=1, max_batch_size=4, batching=True)
    replies = [_enqueue(sched, "r0")] + [_enqueue(sched, f"r{i}") for i in range(1, 4)]
    _sync(sched)
    inst.complete(0)  # batch of 1
    _sync(sched)
    inst.complete(1)  # batch of 3
    for r in replies:
        r.get(timeout=WAIT)
    snap = _sync(sched)
    assert snap["name"] == "m" and snap["version"] == 1
    assert snap["execution_count"] == 2
    assert snap["inference_count"] == 4
    assert snap["last_inference"] > 0
    # batch size → (count, compute_input ns, compute_infer ns, compute_output ns)
    assert snap["batches"] == {1: (1, 0, 10, 0), 3: (1, 0, 10, 0)}
    durations = snap["durations"]
    assert durations["success"][0] == 4
    assert durations["queue"][0] == 4
    assert durations["compute_infer"] == (4, 40)
    assert durations["fail"] == (0, 0)
    assert stats.execution_count == 2


@pytest.mark.timeout(30)
def test_backend_failure_fails_only_that_batch(make) -> None:
    sched, [inst], _ = make(n_instances=1, max_batch_size=4, batching=True)
    lone = _enqueue(sched, "lone")
    batch = [_enqueue(sched, f"b{i}") for i in range(2)]
    _sync(sched)
    inst.fail(0, ValueError("model crashed"))
    with pytest.raises(TritonError) as info:
        lone.get(timeout=WAIT)
    assert info.value.code == Code.INTERNAL
    assert "inst0" in info.value.message and "model crashed" in info.value.message
    _sync(sched)
    # the instance is idle again and serves the next batch normally
    assert _ids(inst.calls[1][0]) == ["b0", "b1"]
    inst.complete(1)
    assert [r.get(timeout=WAIT).parameters["rid"] for r in batch] == ["b0", "b1"]
    snap = _sync(sched)
    assert snap["durations"]["fail"][0] == 1
    assert snap["durations"]["success"][0] == 2
    assert snap["inference_count"] == 2


@pytest.mark.timeout(30)
def test_triton_error_from_backend_is_passed_through(make) -> None:
    sched, [inst], _ = make(n_instances=1)
    reply = _enqueue(sched, "r")
    _sync(sched)
    error = TritonError.invalid_arg("bad input for the model")
    inst.fail(0, error)
    with pytest.raises(TritonError) as info:
        reply.get(timeout=WAIT)
    assert info.value is error


@pytest.mark.timeout(30)
def test_per_request_errors_fail_only_those_requests(make) -> None:
    sched, [inst], _ = make(n_instances=1, max_batch_size=4, batching=True)
    _enqueue(sched, "first")
    replies = [_enqueue(sched, f"r{i}") for i in range(3)]
    _sync(sched)
    inst.complete(0)
    _sync(sched)
    ok0 = InferResponse([("OUT", np.array([0]))], {"rid": "r0"})
    ok2 = InferResponse([("OUT", np.array([2]))], {"rid": "r2"})
    inst.complete(1, results=[ok0, TritonError.invalid_arg("only r1 is bad"), ok2])
    assert replies[0].get(timeout=WAIT) is ok0
    assert replies[2].get(timeout=WAIT) is ok2
    with pytest.raises(TritonError, match="only r1 is bad"):
        replies[1].get(timeout=WAIT)
    snap = _sync(sched)
    assert snap["durations"]["fail"][0] == 1
    assert snap["durations"]["success"][0] == 3  # "first" + r0 + r2
    assert snap["execution_count"] == 2


@pytest.mark.timeout(30)
def test_drain_answers_only_when_queue_empty_and_nothing_busy(make) -> None:
    sched, [inst], _ = make(n_instances=1)
    for i in range(2):
        _enqueue(sched, f"r{i}")
    drained: Reply[None] = Reply()
    sched.ref.tell(Drain(drained))
    _sync(sched)
    assert not drained.ready()  # r0 running, r1 queued
    inst.complete(0)
    _sync(sched)
    assert not drained.ready()  # r1 running now
    inst.complete(1)
    assert drained.get(timeout=WAIT) is None


@pytest.mark.timeout(30)
def test_drain_of_idle_scheduler_answers_at_once(make) -> None:
    sched, _, _ = make(n_instances=2)
    drained: Reply[None] = Reply()
    sched.ref.tell(Drain(drained))
    assert drained.get(timeout=WAIT) is None


@pytest.mark.timeout(30)
def test_stopping_the_scheduler_fails_queued_requests(make) -> None:
    """Requests waiting in the scheduler's queue must not wait forever once it stops
    (design: "every pending ask fails when an actor stops, so nobody waits forever")."""
    sched, [inst], _ = make(n_instances=1)
    running = _enqueue(sched, "running")
    queued = [_enqueue(sched, f"q{i}") for i in range(2)]
    drained: Reply[None] = Reply()
    _sync(sched)
    sched.ref.tell(Drain(drained))
    sched.stop(timeout=WAIT)
    assert not sched.alive
    assert len(inst.calls) == 1 and not running.ready()
    for reply in queued:
        assert reply.ready(), "a queued request was left waiting after the scheduler stopped"
        error = reply.exception()
        assert isinstance(error, TritonError) and error.code == Code.UNAVAILABLE
    assert drained.ready(), "a Drain was left waiting after the scheduler stopped"


# -- the full dynamic batcher: the queue delay, timeouts, queue size, ordering (batch_queue.py decides;
# these check that the actor acts on its decisions: a timer wakes it, expired requests get their error)
def _policy(**kw: Any) -> BatchPolicy:
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("preferred", (4,))
    return BatchPolicy(**kw)


@pytest.mark.timeout(30)
def test_queue_delay_holds_a_small_batch_until_the_timer_fires(make) -> None:
    sched, [inst], _ = make(policy=_policy(max_delay_ns=50_000_000))
    start = time.perf_counter_ns()
    reply = _enqueue(sched, "a")
    _sync(sched)
    assert inst.calls == []  # below the preferred size: it waits for company
    assert inst.called.wait(WAIT)  # nothing else is sent: the scheduler's own timer woke it
    assert time.perf_counter_ns() - start >= 50_000_000  # not before the delay (counted from its arrival)
    assert len(inst.calls) == 1 and _ids(inst.calls[0][0]) == ["a"]
    inst.complete(0)
    assert reply.get(timeout=WAIT).parameters == {"rid": "a"}


@pytest.mark.timeout(30)
def test_preferred_size_dispatches_without_waiting_for_the_delay(make) -> None:
    sched, [inst], _ = make(policy=_policy(max_delay_ns=60_000_000_000))  # a minute
    for i in range(4):
        _enqueue(sched, f"r{i}")
    _sync(sched)
    assert len(inst.calls) == 1 and _ids(inst.calls[0][0]) == ["r0", "r1", "r2", "r3"]


@pytest.mark.timeout(30)
def test_timed_out_request_fails_while_every_instance_is_busy(make) -> None:
    policy = _policy(max_batch_size=0, preferred=(), policies={1: QueuePolicy(default_timeout_ns=50_000_000)})
    sched, [inst], _ = make(policy=policy)
    running = _enqueue(sched, "running")
    waiting = _enqueue(sched, "waiting")
    _sync(sched)
    with pytest.raises(TritonError) as e:
        waiting.get(timeout=WAIT)  # answered by the timer, not by the (still busy) instance
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message == "[request id: waiting] Request timeout expired"
    inst.complete(0)
    assert running.get(timeout=WAIT).parameters == {"rid": "running"}
    snap = _sync(sched)
    assert snap["durations"]["fail"][0] == 1 and len(inst.calls) == 1  # the expired one never ran


@pytest.mark.timeout(30)
def test_request_timeout_parameter_overrides_when_allowed(make) -> None:
    policy = _policy(max_batch_size=0, preferred=(),
                     policies={1: QueuePolicy(default_timeout_ns=60_000_000_000, allow_timeout_override=True)})
    sched, [inst], _ = make(policy=policy)
    _enqueue(sched, "running")
    patient = _enqueue(sched, "patient")
    hurried = _enqueue(sched, "hurried", timeout_us=20_000)
    with pytest.raises(TritonError):
        hurried.get(timeout=WAIT)
    assert not patient.ready()
    inst.complete(0)
    _sync(sched)
    assert _ids(inst.calls[1][0]) == ["patient"]


@pytest.mark.timeout(30)
def test_full_queue_rejects_at_once_and_other_requests_are_undisturbed(make) -> None:
    policy = _policy(max_batch_size=0, preferred=(), policies={1: QueuePolicy(max_queue_size=1)})
    sched, [inst], _ = make(policy=policy)
    first = _enqueue(sched, "first")  # runs: the queue is empty again
    queued = _enqueue(sched, "queued")
    refused = _enqueue(sched, "refused")
    with pytest.raises(TritonError) as e:
        refused.get(timeout=WAIT)
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message == "[request id: refused] Exceeds maximum queue size"
    inst.complete(0)
    _sync(sched)
    inst.complete(1)
    assert first.get(timeout=WAIT).parameters == {"rid": "first"}
    assert queued.get(timeout=WAIT).parameters == {"rid": "queued"}


@pytest.mark.timeout(30)
def test_priority_levels_pick_the_highest_waiting_request(make) -> None:
    policy = _policy(max_batch_size=0, preferred=(), priority_levels=2, default_priority=2,
                     policies={1: QueuePolicy(), 2: QueuePolicy()})
    sched, [inst], _ = make(policy=policy)
    _enqueue(sched, "running")
    _enqueue(sched, "normal")  # priority 0 → default level 2
    _enqueue(sched, "urgent", priority=1)
    _sync(sched)
    inst.complete(0)
    _sync(sched)
    assert _ids(inst.calls[1][0]) == ["urgent"]


@pytest.mark.timeout(30)
def test_preserve_ordering_releases_replies_in_arrival_order(make) -> None:
    sched, instances, _ = make(n_instances=2, policy=_policy(max_batch_size=0, preferred=(), preserve_ordering=True))
    first, second = _enqueue(sched, "first"), _enqueue(sched, "second")
    _sync(sched)
    instances[1].complete(0)  # "second" finishes first...
    _sync(sched)
    assert not second.ready()  # ...but is held until "first" is answered
    instances[0].complete(0)
    assert first.get(timeout=WAIT).parameters == {"rid": "first"}
    assert second.get(timeout=WAIT).parameters == {"rid": "second"}


@pytest.mark.timeout(30)
def test_without_preserve_ordering_replies_go_as_soon_as_ready(make) -> None:
    sched, instances, _ = make(n_instances=2, policy=_policy(max_batch_size=0, preferred=()))
    _enqueue(sched, "first")
    second = _enqueue(sched, "second")
    _sync(sched)
    instances[1].complete(0)
    assert second.get(timeout=WAIT).parameters == {"rid": "second"}


def test_a_batch_answered_with_the_wrong_number_of_results_fails_alone(make) -> None:
    """Every request of the batch is answered and the instance comes back (nothing stranded)."""
    sched, (inst,), _stats = make()
    first = _enqueue(sched, "a")
    sched.ref.ask(GetStats(), timeout=WAIT)  # the barrier: the batch went to the instance
    inst.complete(0, results=[])  # a backend that returned nothing for one request
    with pytest.raises(TritonError) as info:
        first.get(WAIT)
    assert info.value.code == Code.INTERNAL
    second = _enqueue(sched, "b")
    sched.ref.ask(GetStats(), timeout=WAIT)
    inst.complete(1)
    assert second.get(WAIT).parameters == {"rid": "b"}


@pytest.mark.timeout(30)
def test_an_instance_that_is_not_up_leaves_the_pool_and_comes_back(make) -> None:
    """A dead instance answers at once, so it looked idle and drew the work; out of the pool, the queue
    waits for the live one. RESTARTING then UP: it takes work again. Nothing is failed meanwhile."""
    sched, (a, b), _ = make(n_instances=2)
    b.become(RESTARTING, "its thread died")
    replies = [_enqueue(sched, f"r{i}") for i in range(3)]
    _sync(sched)
    assert [len(i.calls) for i in (a, b)] == [1, 0]
    a.complete(0)
    _sync(sched)
    b.become(UP)
    _sync(sched)
    assert [len(i.calls) for i in (a, b)] == [2, 1]
    a.complete(1)
    b.complete(0)
    assert [r.get(timeout=WAIT).parameters["rid"] for r in replies] == ["r0", "r1", "r2"]
    assert sched.ref.ask(GetStatus(), timeout=WAIT)["down_instances"] == []
    assert DOWNS == []


@pytest.mark.timeout(30)
def test_an_instance_that_dies_while_running_does_not_come_back_after_its_batch(make) -> None:
    sched, (a, b), _ = make(n_instances=2)
    first, second = _enqueue(sched, "r0"), _enqueue(sched, "r1")
    _sync(sched)
    b.become(DOWN, "past its restart budget")
    b.fail(0, TritonError.unavailable("instance 'inst1' stopped unexpectedly"))  # the worker answers its batch
    with pytest.raises(TritonError):
        second.get(timeout=WAIT)
    replies = [_enqueue(sched, f"n{i}") for i in range(2)]
    _sync(sched)
    assert [len(i.calls) for i in (a, b)] == [1, 1]  # nothing more for the dead one
    for i in range(3):
        a.complete(i)
        _sync(sched)
    assert first.get(timeout=WAIT).parameters["rid"] == "r0"
    assert [r.get(timeout=WAIT).parameters["rid"] for r in replies] == ["n0", "n1"]
    assert sched.ref.ask(GetStatus(), timeout=WAIT)["down_instances"] == ["inst1 (DOWN)"]
    assert DOWNS == []


@pytest.mark.timeout(30)
def test_every_instance_down_fails_the_queue_and_tells_the_model_once(make) -> None:
    sched, (a, b), _stats = make(n_instances=2)
    b.become(DOWN, "b gave up")
    running = _enqueue(sched, "r0")
    queued = _enqueue(sched, "r1")
    _sync(sched)
    assert [len(i.calls) for i in (a, b)] == [1, 0] and DOWNS == []
    a.become(DOWN, "a gave up")
    _sync(sched)
    with pytest.raises(TritonError) as info:
        queued.get(timeout=WAIT)
    assert info.value.code == Code.UNAVAILABLE and info.value.message == "model 'm' version 1 has no instance left: a gave up"
    later = _enqueue(sched, "r2")  # before the model actor publishes the version's new state
    with pytest.raises(TritonError):
        later.get(timeout=WAIT)
    a.become(UP)  # DOWN is for good in ModelInstance; a stray UP changes nothing here either
    _sync(sched)
    assert DOWNS == [(sched, "a gave up")]
    a.fail(0, TritonError.unavailable("stopped"))  # the running batch is answered by its worker
    with pytest.raises(TritonError):
        running.get(timeout=WAIT)
    drained: Reply[None] = Reply()
    sched.ref.tell(Drain(drained))
    assert drained.get(timeout=WAIT) is None  # unloading it does not wait for instances that are gone


@pytest.mark.timeout(30)
def test_requests_failed_for_want_of_an_instance_count_as_other(make) -> None:
    """Triton counts REJECTED for the scheduler's queue policy (a queue timeout) only; a request that fails
    because no instance is left is an OTHER failure, as the sequence scheduler counted it already."""
    sched, (a,), stats = make()
    running, queued = _enqueue(sched, "r0"), _enqueue(sched, "r1")
    _sync(sched)
    a.become(DOWN, "a gave up")
    later = _enqueue(sched, "r2")
    for reply in (queued, later):
        with pytest.raises(TritonError):
            reply.get(timeout=WAIT)
    assert stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 2}
    a.fail(0, TritonError.unavailable("stopped"))
    with pytest.raises(TritonError):
        running.get(timeout=WAIT)


@pytest.mark.timeout(30)
def test_preserve_ordering_goes_on_after_a_batch_that_could_not_be_answered(make) -> None:
    """A batch whose answering fails gives up its places in the order: later replies are not held for it."""
    sched, (a,), _ = make(policy=_policy(max_batch_size=0, preferred=(), preserve_ordering=True))
    first, second = _enqueue(sched, "first"), _enqueue(sched, "second")
    _sync(sched)
    a.complete(0, results=[])  # a backend that returned nothing for one request
    with pytest.raises(TritonError) as info:
        first.get(timeout=WAIT)
    assert info.value.code == Code.INTERNAL
    _sync(sched)
    a.complete(1)
    assert second.get(timeout=WAIT).parameters == {"rid": "second"}


@pytest.mark.timeout(30)
def test_a_rescheduled_request_refused_by_a_full_queue_counts_as_rejected(make) -> None:
    """The queue's refusals are REJECTED (Triton's failure reasons), a rescheduled request's as a new one's."""
    policy = _policy(max_batch_size=0, preferred=(), policies={1: QueuePolicy(max_queue_size=1)})
    sched, [inst], stats = make(policy=policy)
    again = _enqueue(sched, "again")  # runs
    queued = _enqueue(sched, "queued")  # fills the queue
    _sync(sched)
    inst.complete(0, results=[RESCHEDULE])  # the model releases it with RESCHEDULE: the queue is full
    with pytest.raises(TritonError) as e:
        again.get(timeout=WAIT)
    assert e.value.message == "[request id: again] Exceeds maximum queue size"
    _sync(sched)
    inst.complete(1)
    assert queued.get(timeout=WAIT).parameters == {"rid": "queued"}
    assert stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


class InlineInstance(FakeInstance):
    """A model promoted to run in the caller (actors/scheduling/instance.py): each batch is answered before execute returns."""

    inline = True

    def execute(self, requests: list[InferRequest], done: Callable[[bool, Any], None]) -> None:
        super().execute(requests, done)
        self.complete(len(self.calls) - 1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batching", [False, True])
def test_inline_batches_yield_to_the_hub_after_their_share_of_a_turn(batching: bool) -> None:
    """A queue worked through by an inline instance starts at most ``inline_per_turn`` batches in one hub
    turn (the turn here never changes by itself: only the scheduler's own next-turn wake-up starts a new
    one), the rest in the next turns; every request is answered, in order."""
    inst, stats = InlineInstance("inst0"), VersionStats("m", 1)
    policy = BatchPolicy(max_batch_size=1, preferred=(1,)) if batching else None
    sched = SchedulerActor("scheduler:m:1", [inst], stats, policy, inline_per_turn=4, turn=lambda: 0)  # type: ignore[list-item]
    sched.start()
    try:
        replies = [_enqueue(sched, f"r{i}") for i in range(10)]  # one greenlet, one turn
        _sync(sched)
        assert len(inst.calls) == 4 and [r.ready() for r in replies] == [True] * 4 + [False] * 6
        assert [r.get(timeout=WAIT).parameters["rid"] for r in replies] == [f"r{i}" for i in range(10)]
        assert _ids([c[0][0] for c in inst.calls]) == [f"r{i}" for i in range(10)]
    finally:
        sched.stop(timeout=WAIT)


@pytest.mark.timeout(30)
@pytest.mark.skipif(not fastpath.enabled, reason="answered on the sender's stack only while fast paths are on")
def test_inline_batches_of_separate_turns_never_wait() -> None:
    """The share is per hub turn: requests that arrive in turns of their own all run at once."""
    inst, stats = InlineInstance("inst0"), VersionStats("m", 1)
    turn = [0]
    sched = SchedulerActor("scheduler:m:1", [inst], stats, inline_per_turn=2, turn=lambda: turn[0])  # type: ignore[list-item]
    sched.start()
    try:
        for i in range(6):
            turn[0] = i  # the hub ran in between
            assert _enqueue(sched, f"r{i}").ready()  # answered on this stack, no wake-up needed
    finally:
        sched.stop(timeout=WAIT)

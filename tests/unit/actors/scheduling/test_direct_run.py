"""The scheduler's direct run (``SchedulerActor.direct``): a request sent through a version handle to an
idle, promoted instance runs on the sender's stack with no message, and everything the message path
guarantees still holds: nothing overtakes a request that waits, the statistics are a batch's, and a
model that demotes (or fails inline) mid-run goes back to its thread and is still answered.

Real :class:`ModelInstance` objects on their native threads, a fake backend; each test runs with fast
paths on and off (the slow path is the specification: the same answers, the same statistics).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import gevent.event
import numpy as np
import pytest
from gevent import monkey
from google.protobuf import text_format

from triton_actor.actors.model.handles import READY, CachedVersionHandle, VersionHandle
from triton_actor.actors.scheduling import instance as instance_mod
from triton_actor.actors.scheduling.ensemble import EnsembleScheduler
from triton_actor.actors.scheduling.ensemble_step import StepReply
from triton_actor.actors.scheduling.instance import ModelInstance
from triton_actor.actors.scheduling.scheduler import Drain, GetStats, GetStatus, SchedulerActor
from triton_actor.backends.base import InstanceContext
from triton_actor.errors import TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.metrics.statistics import VersionStats
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository.config import ModelConfig
from triton_actor.repository.ensemble_graph import check_scheduling
from triton_actor.runtime import fastpath
from triton_actor.runtime.kernel import Reply

WAIT = 10.0
_native_ident = monkey.get_original("_thread", "get_ident")


class Recording:
    """A backend instance that may run inline: records which request ran where, in what order."""

    inline_ok = True

    def __init__(self) -> None:
        self.threads: set[int] = set()  # the native threads of the instances it backs, added when created there
        self.ran: list[tuple[str, bool]] = []  # (request id, on its own thread)
        self.gate: gevent.event.Event | None = None  # a run waits on it (the model yields)
        self.inside = gevent.event.Event()  # set once a run waits on the gate
        self.fail_inline = False  # fails when run anywhere but its thread (per-thread state)

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        own = _native_ident() in self.threads
        self.ran.extend((r.id, own) for r in requests)
        if self.gate is not None and not own:
            self.inside.set()
            self.gate.wait()
        if self.fail_inline and not own:
            return [TritonError.internal("no thread state here") for _ in requests]
        return [InferResponse([("OUT", np.array([1]))], {"rid": r.id}) for r in requests]

    def finalize(self) -> None:
        pass


class Backend:
    def __init__(self) -> None:
        self.instance = Recording()

    def create(self, ctx: InstanceContext) -> Recording:
        self.instance.threads.add(_native_ident())
        return self.instance


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def fast(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Both ways: the switch is read when the scheduler starts (its mailbox) and when it is built."""
    was = fastpath.enabled
    fastpath.set_enabled(request.param)
    yield request.param
    fastpath.set_enabled(was)


class Version:
    """One version: a scheduler over one promoted instance, sent to through its handle as the data plane does."""

    def __init__(self, per_turn: int = 64, turn: Any = None, promoted: bool | None = None, count: int = 1) -> None:
        backend = Backend()
        self.instances = []
        for i in range(count):
            ctx = InstanceContext("m", 1, Path("."), Path("."), ModelConfig(name="m"), "{}", f"m_{i}", "CPU", 0, 0)
            inst = ModelInstance(ctx, backend)  # type: ignore[arg-type]
            inst.wait_ready(WAIT)
            # as if promoted (32 short runs on its thread), which happens only while fast paths are on
            inst.inline = fastpath.enabled if promoted is None else promoted
            self.instances.append(inst)
        self.instance = self.instances[0]
        self.model = backend.instance
        self.stats = VersionStats("m", 1)
        self.scheduler = SchedulerActor("scheduler:m:1", self.instances, self.stats, inline_per_turn=per_turn,
                                        turn=turn)
        self.scheduler.start()
        self.handle = VersionHandle(1, READY, "", self.scheduler)

    def send(self, rid: str) -> Reply[InferResponse]:
        reply: Reply[InferResponse] = Reply()
        x = np.zeros((1,), np.float32)
        self.handle.enqueue(InferRequest("m", 1, rid, {"X": InferInput("X", BY_WIRE["FP32"], (1,), x)}), 1, reply)
        return reply

    def statistics(self) -> dict[str, Any]:
        return self.scheduler.ref.ask(GetStats(), timeout=WAIT)  # also: every message sent before is handled

    def close(self) -> None:
        self.scheduler.stop(timeout=WAIT)
        for inst in self.instances:
            inst.close(WAIT)


@pytest.fixture
def version(fast: bool) -> Iterator[Any]:
    made: list[Version] = []

    def make(**kw: Any) -> Version:
        made.append(Version(**kw))
        return made[-1]

    yield make
    for v in made:
        v.close()


def _answers(replies: list[Reply[InferResponse]]) -> list[str]:
    return [r.get(timeout=WAIT).parameters["rid"] for r in replies]


def test_a_request_to_an_idle_promoted_instance_is_answered_with_the_statistics_of_a_batch(fast, version) -> None:
    v = version()
    replies = []
    for i in range(3):
        replies.append(v.send(f"r{i}"))
        if fast:
            assert replies[-1].ready()  # answered on this stack: no message, no turn of the hub
    assert _answers(replies) == ["r0", "r1", "r2"]
    assert v.model.ran == [(f"r{i}", not fast) for i in range(3)]  # inline while fast paths are on
    snap = v.statistics()
    assert (snap["inference_count"], snap["execution_count"]) == (3, 3)
    durations = snap["durations"]
    for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert durations[name][0] == 3, name  # every request counted in every duration
    assert durations["success"][1] > 0 and durations["compute_infer"][1] > 0 and durations["queue"][1] >= 0
    assert snap["batches"][1][0] == 3 and snap["last_inference"] > 0
    assert snap["failures"] == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    timings = replies[0].get(timeout=WAIT).timings
    assert len(timings) == 4 and timings[2] > 0  # (queue, compute input, infer, output), as an ensemble adds them


def test_a_request_never_overtakes_those_waiting_for_the_next_turn(fast, version) -> None:
    """Two inline batches per hub turn: the rest wait in the queue for the next turn. A request sent
    after them, even once the turn has moved on, runs after them."""
    turn = [0]
    v = version(per_turn=2, turn=lambda: turn[0])
    replies = [v.send(f"r{i}") for i in range(4)]  # one turn: r2 and r3 wait
    if fast:
        assert [r.ready() for r in replies] == [True, True, False, False]
    turn[0] = 1  # the hub moved on; the scheduler's wake-up for the queue has not come yet
    replies.append(v.send("r4"))
    assert _answers(replies) == [f"r{i}" for i in range(5)]
    assert [rid for rid, _own in v.model.ran] == [f"r{i}" for i in range(5)]
    assert v.statistics()["execution_count"] == 5


def test_a_request_sent_while_a_run_yields_waits_for_it(fast, version) -> None:
    """A model that yields inline (a patched wait) leaves the scheduler busy: another greenlet's request
    is handled after that run, never beside it in the same actor, though a second instance is idle."""
    v = version(promoted=True, count=2)  # with fast paths off too: the run then yields in the actor's loop greenlet
    v.model.gate = gevent.event.Event()
    first = gevent.spawn(v.send, "r0")
    assert v.model.inside.wait(WAIT)  # r0 runs, inside the model
    second = v.send("r1")
    assert not second.ready() and [rid for rid, _own in v.model.ran] == ["r0"]
    v.model.gate.set()
    assert _answers([first.get(timeout=WAIT), second]) == ["r0", "r1"]
    assert v.statistics()["execution_count"] == 2


def test_a_model_that_demotes_mid_run_goes_back_to_its_thread(fast, version, monkeypatch) -> None:
    v = version()
    assert _answers([v.send("fast0"), v.send("fast1")]) == ["fast0", "fast1"]
    monkeypatch.setattr(instance_mod, "DEMOTE_NS", -1)  # every run is slow now: one clocked demotes at once
    monkeypatch.setattr(instance_mod, "DEMOTE_AT_ONCE_NS", -1)
    # the first long run is judged by its wall time (its CPU clock was not read: the run before was short),
    # which never demotes at once by itself; the next one is clocked and does
    assert _answers([v.send("slow0")]) == ["slow0"]
    assert v.instance.inline == fast
    assert _answers([v.send("slow1")]) == ["slow1"]
    assert not v.instance.inline
    later = [v.send(f"later{i}") for i in range(3)]
    assert _answers(later) == ["later0", "later1", "later2"]
    assert v.model.ran == [("fast0", not fast), ("fast1", not fast), ("slow0", not fast), ("slow1", not fast),
                           ("later0", True), ("later1", True), ("later2", True)]
    snap = v.statistics()
    assert (snap["inference_count"], snap["execution_count"]) == (7, 7)
    assert snap["durations"]["success"][0] == 7 and snap["durations"]["queue"][0] == 7


def test_a_run_that_fails_inline_is_answered_from_its_thread(fast, version) -> None:
    """An inline run that fails is run again on the instance's thread (actors/scheduling/instance.py);
    the request sent directly is answered by that run, and the next one finds the instance idle."""
    v = version()
    v.model.fail_inline = True
    first = v.send("r0")
    assert _answers([first]) == ["r0"]
    assert v.model.ran[-1] == ("r0", True)
    assert _answers([v.send("r1")]) == ["r1"]
    snap = v.statistics()
    assert (snap["inference_count"], snap["execution_count"]) == (2, 2)
    assert snap["failures"]["BACKEND"] == 0


def _step(v: Version, rid: str) -> Any:
    """An ensemble chain's step as ensemble_chain.py runs it: the scheduler's ``step_direct``, through the handle."""
    runner = v.handle.step_runner()
    x = np.zeros((1,), np.float32)
    return runner(InferRequest("m", 1, rid, {"X": InferInput("X", BY_WIRE["FP32"], (1,), x)}), 1, StepReply)


def test_a_chain_step_to_an_idle_promoted_instance_gets_its_response_with_a_batch_statistics(fast, version) -> None:
    v = version()
    answers = [_step(v, f"s{i}") for i in range(2)]
    if not fast:  # not taken: the chain (a fast path itself) is not run then
        assert answers == [None, None] and v.model.ran == []
        return
    assert [type(a) for a in answers] == [InferResponse, InferResponse]  # no reply: answered on this stack
    assert [a.parameters["rid"] for a in answers] == ["s0", "s1"] and v.model.ran == [("s0", False), ("s1", False)]
    assert answers[0].timings[0] == 0 and answers[0].timings[2] > 0  # never queued; its compute times
    snap = v.statistics()
    assert (snap["inference_count"], snap["execution_count"]) == (2, 2)
    assert snap["durations"]["success"][0] == 2 and tuple(snap["durations"]["queue"]) == (2, 0)
    assert _answers([v.send("r0")]) == ["r0"]  # the instance is idle again, the actor not held


def test_a_chain_step_that_fails_inline_gets_a_reply_answered_from_the_thread(fast, version) -> None:
    v = version()
    v.model.fail_inline = True
    answer = _step(v, "s0")
    if not fast:
        assert answer is None
        return
    assert isinstance(answer, StepReply)
    assert answer.get(timeout=WAIT).parameters["rid"] == "s0" and v.model.ran[-1] == ("s0", True)
    assert _answers([v.send("r1")]) == ["r1"]
    snap = v.statistics()
    assert (snap["inference_count"], snap["execution_count"]) == (2, 2) and snap["failures"]["BACKEND"] == 0


def test_a_chain_step_is_not_run_here_behind_waiting_requests(fast, version) -> None:
    turn = [0]
    v = version(per_turn=1, turn=lambda: turn[0])
    first = v.send("r0")  # this turn's one inline batch
    assert _step(v, "s0") is None  # the turn's share is spent: the chain enqueues the step instead
    assert _answers([first]) == ["r0"]


def test_a_version_behind_the_response_cache_has_no_step_runner() -> None:
    handle = CachedVersionHandle(1, READY, "", object(), cache=object())
    assert handle.step_runner() is None


def test_a_chain_step_that_yields_holds_the_version_and_one_killed_gives_its_instance_back(fast, version) -> None:
    """A step run here stays in the pool's idle list while it runs (step_direct's shortcut): a model
    that yields still keeps every other request out until it returns, and a step killed while it
    yields leaves its instance idle for the next request, with both instances in the pool."""
    if not fast:
        return  # no chain without fast paths: test_a_request_sent_while_a_run_yields_waits_for_it covers direct()
    v = version(promoted=True, count=2)
    v.model.gate = gevent.event.Event()
    first = gevent.spawn(_step, v, "s0")
    assert v.model.inside.wait(WAIT)
    assert _step(v, "s1") is None  # the actor is held: the chain would enqueue this step
    second = v.send("r1")
    assert not second.ready() and [rid for rid, _own in v.model.ran] == ["s0"]
    v.model.gate.set()
    assert first.get(timeout=WAIT).parameters["rid"] == "s0" and _answers([second]) == ["r1"]
    v.model.gate, v.model.inside = gevent.event.Event(), gevent.event.Event()
    assert _killed_while_yielding(v, lambda: _step(v, "s2")) == 3  # s0, r1 and the next; s2 failed CANCELLED


def _killed_while_yielding(v: Version, run: Any) -> int:
    """Kill ``run``'s greenlet while the model yields in it, send the next request: the instances are all
    idle once (none twice) when every message was handled; the inferences counted."""
    v.model.gate = gevent.event.Event()
    runner = gevent.spawn(run)
    assert v.model.inside.wait(WAIT)
    runner.kill(block=True, timeout=WAIT)
    v.model.gate.set()
    assert _answers([v.send("next")]) == ["next"]
    snap = v.statistics()  # every message handled: the killed run's completion too
    assert sorted(map(id, v.scheduler._pool.idle)) == sorted(map(id, v.instances))
    return snap["inference_count"]


def test_a_direct_run_killed_while_its_model_yields_is_answered_and_gives_its_instance_back(fast, version) -> None:
    """direct() leaves the instance in the idle list while it runs (the actor is held); a run killed while
    the model yields is answered CANCELLED and its instance is idle once, never twice, for the next one."""
    v = version(promoted=True, count=2)
    # slow: r0 ran in the actor's loop greenlet, which the kill of its sender does not stop
    assert _killed_while_yielding(v, lambda: v.send("r0")) == (1 if fast else 2)


def test_a_chain_step_whose_instance_thread_is_gone_gets_a_step_reply_with_its_error(fast, version) -> None:
    """An inline run that fails goes to the instance's thread; a thread already gone answers at once, on
    run_here's own stack: the step still gets its kind of reply (the chain reads it as a StepReply)."""
    if not fast:
        return  # no chain without fast paths
    v = version()
    v.model.fail_inline = True
    # its thread's loop died (it marks the worker closed) and the hub has not yet told the instance: the
    # window where submit_callback answers at once; close() would also take the instance out of the pool
    v.instance._worker._closed = True
    answer = _step(v, "s0")
    assert isinstance(answer, StepReply) and answer.ready()
    assert isinstance(answer.exception(), TritonError)


class _AcceptsAll:
    """A validator (hashable: the ensemble's memo keys by it) that accepts every request as a batch of one."""

    def check(self, _request: InferRequest) -> int:
        return 1

    def batch_reshaped(self, inputs: dict) -> dict:  # nothing to reshape (the ensemble asks)
        return inputs


def test_an_ensemble_request_killed_while_a_step_yields_ends_cancelled_and_drains(fast, version) -> None:
    """A client's greenlet killed (a gRPC cancel) while a composing model yields inline: the ensemble's run
    ends CANCELLED instead of staying in flight, so a Drain (an unload's) completes."""
    v = version(promoted=True)
    accepts_all = _AcceptsAll()
    step = VersionHandle(1, READY, "", v.scheduler, accepts_all)
    route = SimpleNamespace(name="m", config=SimpleNamespace(model_transaction_policy=SimpleNamespace(decoupled=False)),
                            resolve=lambda _v: step, versions={1: step})
    routes = {"m": route}
    text = '''name: "ens" platform: "ensemble"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "m" model_version: -1 input_map { key: "X" value: "IN" }
                               output_map { key: "OUT" value: "OUT" } } ] }'''
    ens = EnsembleScheduler("ensemble:ens:1", check_scheduling(text_format.Parse(text, ModelConfig())),
                            lambda: routes, VersionStats("ens", 1))
    ens.start()
    try:
        handle = VersionHandle(1, READY, "", ens, accepts_all)
        v.model.gate = gevent.event.Event()
        x = np.zeros((1,), np.float32)
        replies: list[Reply[InferResponse]] = []
        client = gevent.spawn(lambda: replies.append(handle.infer(InferRequest("ens", 1, "e0", {
            "IN": InferInput("IN", BY_WIRE["FP32"], (1,), x)}))))
        assert v.model.inside.wait(WAIT)
        if fast:  # the step runs inline in the client's greenlet: kill it there
            client.kill(block=True, timeout=WAIT)
        v.model.gate.set()
        if not fast:  # the step ran in the scheduler's loop greenlet: answered
            client.join(WAIT)
            assert replies[0].get(timeout=WAIT).outputs[0][0] == "OUT"
        drained: Reply[None] = Reply()
        ens.ref.tell(Drain(drained))
        drained.get(timeout=WAIT)  # never answered while the killed run stayed in flight
        assert ens.ref.ask(GetStatus(), timeout=WAIT)["running"] == 0
    finally:
        ens.stop(timeout=WAIT)

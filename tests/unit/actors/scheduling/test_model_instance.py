"""ModelInstance's inline mode, with a fake backend: what happens when an inline run fails or is killed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gevent
import gevent.event
import numpy as np
from gevent import monkey

from triton_actor.actors.scheduling.instance import DOWN, NEVER, RESTARTING, UP, ModelInstance
from triton_actor.backends.base import InstanceContext
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository.config import ModelConfig


class YieldingInstance:
    """Yields inside execute when told to (like a model calling a patched sleep)."""

    inline_ok = True

    def __init__(self) -> None:
        self.fail_inline = False
        self.sleep = 0.0
        self.thread: int | None = None  # the instance's native thread, set when created there
        self.yielding = gevent.event.Event()  # set once a run is inside its yield

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        if self.sleep:
            self.yielding.set()
            gevent.sleep(self.sleep)  # the model's own yield (its run time is what is tested)
        if self.fail_inline and _native_ident() != self.thread:
            return [TritonError.internal("no thread state here") for _ in requests]
        return [InferResponse([("OUT", np.array([1]))], {}) for _ in requests]

    def finalize(self) -> None:
        pass


_native_ident = monkey.get_original("_thread", "get_ident")


class YieldingBackend:
    def __init__(self) -> None:
        self.instance = YieldingInstance()

    def create(self, ctx: InstanceContext) -> YieldingInstance:
        self.instance.thread = _native_ident()
        return self.instance


def _instance() -> tuple[ModelInstance, YieldingInstance]:
    backend = YieldingBackend()
    ctx = InstanceContext("m", 1, Path("."), Path("."), ModelConfig(name="m"), "{}", "m_0", "CPU", 0, 0)
    inst = ModelInstance(ctx, backend)  # type: ignore[arg-type]
    inst.wait_ready(10)
    inst.inline = True  # as if promoted
    return inst, backend.instance


def _request() -> InferRequest:
    return InferRequest("m", 1, "", {"X": InferInput("X", BY_WIRE["FP32"], (1,), np.zeros(1, np.float32))})


def test_an_inline_run_killed_while_the_model_yields_still_answers_its_batch() -> None:
    inst, model = _instance()
    model.sleep = 5.0
    answers: list[tuple[bool, Any]] = []
    runner = gevent.spawn(inst.execute, [_request()], lambda ok, value: answers.append((ok, value)))
    assert model.yielding.wait(10)  # the inline run is inside the model
    runner.kill(timeout=5)
    assert len(answers) == 1 and answers[0][0] is False
    assert isinstance(answers[0][1], TritonError) and answers[0][1].code == Code.CANCELLED
    assert not inst.inline
    inst.close(10)


def test_a_failed_inline_run_is_answered_by_the_thread_and_never_promoted_again() -> None:
    inst, model = _instance()
    model.fail_inline = True
    answers: list[tuple[bool, Any]] = []
    done = gevent.event.Event()

    def record(ok: bool, value: Any) -> None:
        answers.append((ok, value))
        done.set()

    gevent.spawn(inst.execute, [_request()], record).join(5)
    assert done.wait(10)
    ok, (results, _timings) = answers[0]
    assert ok and isinstance(results[0], InferResponse)
    assert not inst.inline and inst._needed == NEVER
    inst.close(10)


def _run(inst: ModelInstance) -> None:
    finished = gevent.event.Event()
    gevent.spawn(inst.execute, [_request()], lambda ok, value: finished.set())
    assert finished.wait(10)


def test_one_slow_inline_run_does_not_demote_but_a_few_in_a_row_do() -> None:
    """A garbage collection or an OS preemption on a busy host is one slow run; a model that yields
    or computes for long does it every time."""
    from triton_actor.actors.scheduling import instance as mod

    inst, model = _instance()
    model.sleep = (mod.DEMOTE_WALL_NS + mod.DEMOTE_AT_ONCE_WALL_NS) / 2e9  # slow, not far over
    _run(inst)
    model.sleep = 0.0
    _run(inst)
    assert inst.inline
    model.sleep = (mod.DEMOTE_WALL_NS + mod.DEMOTE_AT_ONCE_WALL_NS) / 2e9
    for _ in range(mod.DEMOTE_AFTER - 1):
        _run(inst)
        assert inst.inline
    _run(inst)
    assert not inst.inline and inst._needed == 2 * mod.PROMOTE_STREAK
    inst.close(10)


def test_one_run_far_over_the_limit_demotes_at_once() -> None:
    from triton_actor.actors.scheduling import instance as mod

    inst, model = _instance()
    model.sleep = mod.DEMOTE_AT_ONCE_WALL_NS / 1e9 + 0.01
    _run(inst)
    assert not inst.inline
    inst.close(10)


class _Counting(YieldingBackend):
    def __init__(self) -> None:
        super().__init__()
        self.created = 0

    def create(self, ctx: InstanceContext) -> YieldingInstance:
        self.created += 1
        return super().create(ctx)


def test_an_instance_whose_thread_dies_is_started_again(monkeypatch) -> None:
    """The worker's loop failing (not a model error) answers its work and a new thread with a fresh
    backend instance takes over; past the restart budget the instance stays down, answering UNAVAILABLE."""
    from triton_actor.runtime import bridge

    backend = _Counting()
    ctx = InstanceContext("m", 1, Path("."), Path("."), ModelConfig(name="m"), "{}", "m_0", "CPU", 0, 0)
    inst = ModelInstance(ctx, backend)  # type: ignore[arg-type]
    inst.wait_ready(10)
    events: list[str] = []
    inst.watch(lambda _inst, health, _reason: events.append(health))
    original = bridge.NativeWorker._next_item
    broken = {"on": False}

    def next_item(worker: Any) -> Any:
        if broken["on"]:
            raise RuntimeError("the loop broke")
        return original(worker)

    monkeypatch.setattr(bridge.NativeWorker, "_next_item", next_item)
    for restarts in range(1, 5):
        worker = inst._worker
        broken["on"] = True
        _run(inst)  # wakes the loop, which breaks at its next wait
        assert worker.stopped.get(10) is True
        broken["on"] = False
        # the restart (or, past the budget, DOWN) comes in a link of ``stopped``, after this greenlet woke
        _wait(lambda r=restarts: events.count(RESTARTING) == r or events[-1:] == [DOWN])
        if restarts <= 3:  # the budget of runtime/supervisor.py: 3 restarts a minute
            assert inst._worker is not worker
            inst.wait_ready(10)
            assert backend.created == restarts + 1
        else:
            assert inst._worker is worker and backend.created == 4
    answers: list[tuple[bool, Any]] = []
    inst.execute([_request()], lambda ok, value: answers.append((ok, value)))
    assert answers and answers[0][0] is False and answers[0][1].code == Code.UNAVAILABLE
    # its owner (the scheduler) was told each time: out of the pool while it restarts, back once
    # loaded, and out for good past the budget
    assert events == [RESTARTING, UP] * 3 + [DOWN]
    assert inst.health == DOWN and "stopped 4 times within 60 s" in inst.reason and "the loop broke" in inst.reason
    inst.close(10)


def test_an_instance_whose_restart_fails_to_load_is_down(monkeypatch) -> None:
    from triton_actor.runtime import bridge

    backend = _Counting()
    ctx = InstanceContext("m", 1, Path("."), Path("."), ModelConfig(name="m"), "{}", "m_0", "CPU", 0, 0)
    inst = ModelInstance(ctx, backend)  # type: ignore[arg-type]
    inst.wait_ready(10)
    events: list[tuple[str, str]] = []
    inst.watch(lambda _inst, health, reason: events.append((health, reason)))

    def create(ctx: InstanceContext) -> YieldingInstance:
        raise RuntimeError("the model cannot load again")

    backend.create = create  # type: ignore[method-assign]
    monkeypatch.setattr(bridge.NativeWorker, "_next_item", lambda worker: (_ for _ in ()).throw(RuntimeError("broke")))
    worker = inst._worker
    _run(inst)
    assert worker.stopped.get(10) is True
    _wait(lambda: inst.health == DOWN)  # the restart loads and fails on a new thread
    assert [h for h, _ in events] == [RESTARTING, DOWN]
    assert "failed to restart" in events[-1][1] and "the model cannot load again" in events[-1][1]
    inst.close(10)


class _Revivable:
    """A backend instance that can lose what it runs on (as a process-isolated Python model's process)."""

    inline_ok = False

    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []  # health after each revive(), in order; then "up"
        self.health: tuple[str, str] = ("up", "")
        self.revives = 0

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        if self.health[0] == "down":
            return [TritonError.unavailable("gave up") for _ in requests]
        if requests[0].id == "crash":
            self.health = ("restart", "its process died")
            return [TritonError.internal("the process exited") for _ in requests]
        return [InferResponse([("OUT", np.array([1]))], {}) for _ in requests]

    def revive(self) -> None:
        self.revives += 1
        self.health = self.states.pop(0) if self.states else ("up", "")

    def finalize(self) -> None:
        pass


def _revivable(states: list[tuple[str, str]]) -> tuple[ModelInstance, _Revivable, list[str]]:
    backend_instance = _Revivable()
    backend_instance.states = states
    backend = type("B", (), {"create": lambda self, ctx: backend_instance})()
    ctx = InstanceContext("m", 1, Path("."), Path("."), ModelConfig(name="m"), "{}", "m_0", "CPU", 0, 0)
    inst = ModelInstance(ctx, backend)  # type: ignore[arg-type]
    inst.wait_ready(10)
    events: list[str] = []
    inst.watch(lambda _inst, health, _reason: events.append(health))
    return inst, backend_instance, events


def _ask(inst: ModelInstance, rid: str) -> tuple[bool, Any]:
    answer: gevent.event.AsyncResult = gevent.event.AsyncResult()
    inst.execute([_request()._replace(id=rid)], lambda ok, value: answer.set((ok, value)))
    return answer.get(timeout=10)


def _wait(condition: Any) -> None:
    for _ in range(1000):  # bounded: the revive runs on the instance's thread
        if condition():
            return
        gevent.sleep(0.01)  # the wait-for helper's poll
    raise AssertionError("condition never held")


def test_a_backend_instance_that_lost_its_process_is_revived_out_of_the_pool() -> None:
    """After a failed batch the instance looks at its backend instance: RESTARTING while ``revive()``
    runs on its thread (not at the next batch), UP once that worked, DOWN when it gave up."""
    inst, model, events = _revivable([("up", "")])
    _ask(inst, "crash")
    _wait(lambda: events == [RESTARTING, UP])
    assert model.revives == 1 and _ask(inst, "ok")[0]
    inst.close(10)
    inst, model, events = _revivable([("down", "could not start it")])
    _ask(inst, "crash")
    _wait(lambda: events == [RESTARTING, DOWN])
    assert inst.reason == "could not start it"
    inst.close(10)


def test_a_process_that_dies_again_right_after_its_restart_is_bounded_by_the_budget() -> None:
    inst, model, events = _revivable([("restart", "died at once")] * 10)
    _ask(inst, "crash")
    _wait(lambda: inst.health == DOWN)
    assert model.revives == 4 and events == [RESTARTING, RESTARTING, DOWN]  # 3 more restarts a minute
    assert "again and again after it started" in inst.reason
    inst.close(10)


def test_a_revive_answered_by_a_thread_whose_loop_died_leaves_the_restart_to_it() -> None:
    """A revive queued on a thread whose loop then dies is answered UNAVAILABLE with the rest of its work;
    that answer must not make the instance DOWN for good: the thread's end restarts it (review finding)."""
    inst, _model, events = _revivable([("up", "")])
    worker = inst._worker
    worker.died = RuntimeError("the loop died")  # as NativeWorker records it, before answering its work
    try:
        inst._revived(worker, False, TritonError.unavailable("instance stopped"))
        assert inst.health != DOWN and DOWN not in events
    finally:
        worker.died = None
    inst.close(10)


def test_long_cpu_runs_between_short_ones_demote(monkeypatch) -> None:
    """The thread's CPU clock is read only after a long run: a first long run is judged by its wall time (never
    at once), but a model whose long runs (40 ms of CPU here) alternate with short ones is demoted at its
    second long run, whose CPU was clocked. Short runs alone never read the clock."""
    from triton_actor.actors.scheduling import instance as mod

    inst, _model = _instance()
    cpu = [0]
    reads = [0]
    walls = iter([100_000, 40_000_000, 100_000, 40_000_000, 100_000])

    def run_batch(_instance: Any, requests: list[InferRequest]) -> tuple[list[Any], tuple[int, int, int]]:
        wall = next(walls)
        cpu[0] += wall  # the model computes all the time it runs
        return [InferResponse([("OUT", np.array([1]))], {}) for _ in requests], (0, wall, 0)

    def thread_ns() -> int:
        reads[0] += 1
        return cpu[0]

    monkeypatch.setattr(mod, "_run_batch", run_batch)
    monkeypatch.setattr(mod, "_thread_ns", thread_ns)
    done = []
    assert inst.run_here([_request()], lambda ok, value: done.append(ok)) is not None
    assert reads[0] == 0  # a short run: no clock
    inst.run_here([_request()], lambda ok, value: done.append(ok))  # long, not clocked: slow, still inline
    assert inst.inline and reads[0] == 0
    inst.run_here([_request()], lambda ok, value: done.append(ok))  # short: resets the slow count
    inst.run_here([_request()], lambda ok, value: done.append(ok))  # long and clocked: 40 ms of CPU
    assert not inst.inline and reads[0] >= 2 and not done
    inst.close(10)

"""Supervision of ModelActors by the RepositoryActor (``actors/repository/actor.py``, ``runtime/supervisor.py``):
restart within a budget (the replacement reloads what was serving, load-then-swap), give up past it
(every version UNAVAILABLE with the reason in the index). A fake backend whose ``auto_complete`` raises
a plain exception plays the bug; the budget runs on a manual clock. Waits are on queues and replies.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import gevent.queue
import numpy as np
import pytest

from tests.unit.actors.fakes import CONFIG, WAIT, FakeBackend, until
from triton_actor.actors.model.handles import READY, UNAVAILABLE, ModelHandle
from triton_actor.actors.model.messages import Load, LoadSettings
from triton_actor.actors.repository.actor import RepositoryActor
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime.kernel import Actor, Reply
from triton_actor.runtime.supervisor import MAX_RESTARTS, RESTART_WINDOW_S, RestartBudget


class Repo(RepositoryActor):
    """The real supervisor, reporting each child failure to the test after handling it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.failures: gevent.queue.Queue = gevent.queue.Queue()

    def on_child_failure(self, child: Actor, error: BaseException) -> None:
        super().on_child_failure(child, error)
        self.failures.put(error)


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[tuple[Repo, FakeBackend, Path]]:
    model_dir = tmp_path / "repo" / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    backend = FakeBackend()
    now = [0.0]  # the manual clock: never moves, so every failure falls in one window
    actor = Repo([tmp_path / "repo"], {"fake": backend}, LoadSettings(auto_complete=True),
                 control_mode="explicit", restarts=RestartBudget(clock=lambda: now[0]))
    actor.start()
    actor.ref.load("m").get(WAIT)
    yield actor, backend, model_dir
    actor.ref.unload_all().get(WAIT)
    actor.stop(timeout=WAIT)


def _infer(handle: ModelHandle) -> Reply[InferResponse]:
    x = np.zeros(1, np.float32)
    return handle.resolve(-1).infer(InferRequest("m", -1, "", {"X": InferInput("X", BY_WIRE["FP32"], (1,), x)}))


def _served_by(reply: Reply[InferResponse]) -> int:
    return int(reply.get(WAIT).outputs[0][1][0])


@pytest.mark.timeout(60)
def test_a_failed_model_actor_restarts_and_reloads_while_the_old_snapshot_serves(repo) -> None:
    actor, backend, model_dir = repo
    before, failed = actor.routes["m"], actor._models["m"]
    backend.gate.close()
    in_flight = _infer(before)  # on instance 1, while the model actor fails and restarts
    until(lambda: backend.gate.reached == 1, "the request to run on instance 1")
    backend.bugs = 1
    (model_dir / "1" / "changed").write_text("")  # so the load is not a no-op
    failed.ref.tell(Load(model_dir))  # a tell: its unexpected error goes to the supervisor
    assert isinstance(actor.failures.get(timeout=WAIT), RuntimeError)
    fresh = actor._models["m"]
    assert fresh is not failed and not failed.alive
    until(lambda: actor.routes["m"].versions[1].scheduler is not before.versions[1].scheduler,
           "the restarted actor to swap its reload in")
    assert not in_flight.ready()  # the old snapshot still runs it
    backend.gate.open()
    fresh.ref.load(model_dir).get(WAIT)  # queued behind the restart: the reload is done (then a no-op)
    assert _served_by(in_flight) == 1  # finished on the old snapshot's instance
    after = actor.routes["m"]
    assert after.ready_versions == (1,) and after.versions[1].scheduler is not before.versions[1].scheduler
    assert _served_by(_infer(after)) == 2  # the reloaded instance
    drained: Reply[None] = Reply()
    fresh.ref.settled(drained)  # the old instance drains behind the actor's mailbox
    drained.get(WAIT)
    assert backend.events == [("finalize", 1)]  # the old instance went only after the swap and its drain
    assert actor.ref.index() == [{"name": "m", "version": "1", "state": "READY"}]
    assert actor.failures.empty()


@pytest.mark.timeout(60)
def test_past_the_budget_the_model_is_unavailable_with_the_reason(repo) -> None:
    actor, backend, model_dir = repo
    before = actor.routes["m"]
    backend.gate.close()
    in_flight = _infer(before)
    until(lambda: backend.gate.reached == 1, "the request to run")
    backend.bugs = 100  # every reload fails again
    (model_dir / "1" / "changed").write_text("")  # so the load is not a no-op
    actor._models["m"].ref.tell(Load(model_dir))
    for _ in range(MAX_RESTARTS + 1):  # the first failure, then one per restart's reload
        assert isinstance(actor.failures.get(timeout=WAIT), RuntimeError)
    assert not in_flight.ready()  # still running through every restart
    backend.gate.open()
    last = actor._models["m"]
    with pytest.raises(RuntimeError):  # queued behind the give-up; an error while answering goes to the asker
        last.ref.load(model_dir).get(WAIT)
    assert actor.failures.empty() and last.alive
    assert _served_by(in_flight) == 1  # drained before the unload
    assert backend.events == [("finalize", 1)]
    [entry] = actor.ref.index()
    assert entry["state"] == UNAVAILABLE.value and entry["version"] == "1"
    assert f"failed more than {MAX_RESTARTS} times" in entry["reason"] and "a bug in the backend" in entry["reason"]
    assert actor.routes["m"].ready_versions == ()
    backend.bugs = 0
    actor.ref.load("m").get(WAIT)  # a deliberate load brings it back
    assert actor.routes["m"].versions[1].state == READY
    assert _served_by(_infer(actor.routes["m"])) == 2


@pytest.mark.timeout(60)
def test_an_expected_load_failure_in_a_tell_is_no_actor_failure(repo) -> None:
    actor, _backend, model_dir = repo
    model = actor._models["m"]
    (model_dir / "config.pbtxt").write_text(CONFIG.replace("TYPE_FP32", "TYPE_NOPE", 1))
    model.ref.tell(Load(model_dir))  # a TritonError: logged, the index says why
    model.ref.unload().get(WAIT)  # barrier
    assert actor.failures.empty() and model.alive and actor._models["m"] is model


def test_restart_budget_counts_restarts_in_a_sliding_window() -> None:
    now = [0.0]
    budget = RestartBudget(clock=lambda: now[0])
    assert (budget.max_restarts, budget.window_s) == (MAX_RESTARTS, RESTART_WINDOW_S) == (3, 60.0)
    assert [budget.allow("m") for _ in range(3)] == [True, True, True]
    assert budget.allow("other")  # per child
    now[0] = RESTART_WINDOW_S - 1
    assert not budget.allow("m")  # a fourth failure within the window: give up ...
    assert budget.allow("m") and budget.used("m") == 1  # ... and a later failure starts afresh
    now[0] += RESTART_WINDOW_S
    assert [budget.allow("m") for _ in range(3)] == [True, True, True]  # the old one left the window


def test_restart_budget_forgets_failures_older_than_the_window() -> None:
    now = [0.0]
    budget = RestartBudget(max_restarts=2, window_s=10.0, clock=lambda: now[0])
    for _ in range(10):  # one failure every 6 s: never more than 2 in any 10 s
        assert budget.allow("m")
        now[0] += 6.0
    assert budget.used("m") == 2

"""InstancePool (``triton_actor/actors/scheduling/instance_pool.py``): the spec of its transitions.

A fake owner records what the pool calls back (joined, left, gone, then the model actor's on_down) and
what it is told; fake instances have a health and a watcher, as ModelInstance does. No actors, no gevent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from triton_actor.actors.scheduling.instance import DOWN, RESTARTING, UP
from triton_actor.actors.scheduling.instance_pool import InstanceHealth, InstancePool, version_text
from triton_actor.errors import Code, TritonError


class FakeInstance:
    def __init__(self, name: str, health: str = UP, reason: str = "") -> None:
        self.name, self.health, self.reason = name, health, reason
        self.watcher: Callable[[Any, str, str], None] | None = None

    def watch(self, watcher: Callable[[Any, str, str], None] | None) -> None:
        self.watcher = watcher


class FakeOwner:
    """A scheduler as the pool sees it: a name, a ref to tell, the three calls; ``calls`` in order."""

    name = "scheduler:m:1"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.told: list[object] = []
        self.stopped = False
        self.ref = self

    def tell(self, msg: object) -> None:
        if self.stopped:
            raise TritonError.unavailable("stopped")
        self.told.append(msg)

    def instance_joined(self, instance: FakeInstance) -> None:
        self.calls.append(("joined", instance.name))

    def instance_left(self, instance: FakeInstance, reason: str) -> None:
        self.calls.append(("left", instance.name, reason))

    def pool_gone(self, error: TritonError) -> None:
        self.calls.append(("gone", error.message))


def make(*instances: FakeInstance) -> tuple[InstancePool, FakeOwner]:
    owner = FakeOwner()
    pool = InstancePool(owner, list(instances), lambda o, reason: owner.calls.append(("on_down", o, reason)))  # type: ignore[arg-type]
    pool.start()
    return pool, owner


def health(pool: InstancePool, inst: FakeInstance, state: str, reason: str = "") -> None:
    inst.health, inst.reason = state, reason
    pool.on_health(InstanceHealth(inst, state, reason))  # type: ignore[arg-type]


def test_take_gives_the_first_instance_first_and_release_makes_it_idle_again() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, owner = make(a, b)
    assert pool.take() is a and pool.busy == 1
    assert pool.take() is b and pool.busy == 2 and pool.idle == []
    pool.release(a)
    assert pool.idle == [a] and pool.busy == 1
    assert pool.take(a) is a and pool.idle == []  # a given idle instance
    assert pool.status() == {"busy_instances": 2, "instances": ["a", "b"], "down_instances": []}
    assert owner.calls == [] and pool.gone is None


def test_an_instance_that_is_not_up_leaves_the_pool_and_the_owner_is_told() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, owner = make(a, b)
    health(pool, b, RESTARTING, "its thread died")
    assert pool.idle == [a]
    assert owner.calls == [("left", "b", "its thread died")]
    assert pool.status()["down_instances"] == ["b (RESTARTING)"]
    health(pool, b, UP)
    assert pool.idle == [a, b] and owner.calls[-1] == ("joined", "b")
    assert pool.status()["down_instances"] == []


def test_a_running_instance_that_leaves_is_not_idle_after_its_batch() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, _ = make(a, b)
    pool.take()
    health(pool, a, RESTARTING, "died")
    pool.release(a)
    assert pool.idle == [b] and pool.busy == 0


def test_a_running_instance_back_up_is_idle_only_once_its_batch_is_answered() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, owner = make(a, b)
    pool.take()
    health(pool, a, RESTARTING, "died")
    health(pool, a, UP)
    assert pool.idle == [b] and owner.calls[-1] == ("joined", "a")  # in the pool again, still running
    pool.release(a)
    assert pool.idle == [b, a]


def test_restarting_instances_are_not_gone() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, owner = make(a, b)
    health(pool, a, DOWN, "a gave up")
    health(pool, b, RESTARTING, "b died")
    assert pool.gone is None and pool.idle == []
    assert [c[0] for c in owner.calls] == ["left", "left"]


def test_the_last_instance_down_fails_what_waits_then_tells_the_model_once() -> None:
    a, b = FakeInstance("a"), FakeInstance("b")
    pool, owner = make(a, b)
    pool.take()
    health(pool, b, DOWN, "b gave up")
    health(pool, a, RESTARTING, "a died")
    health(pool, a, DOWN, "a gave up")
    assert pool.gone is not None and pool.gone.code == Code.UNAVAILABLE
    assert pool.gone.message == "model 'm' version 1 has no instance left: a gave up"
    assert owner.calls[-3:] == [("left", "a", "a gave up"), ("gone", pool.gone.message), ("on_down", owner, "a gave up")]
    health(pool, a, UP)  # DOWN is for good in ModelInstance; a stray UP changes nothing here either
    pool.release(a)
    assert pool.idle == [] and pool.busy == 0
    assert [c[0] for c in owner.calls].count("on_down") == 1 and owner.calls[-1][0] == "on_down"
    assert pool.status()["down_instances"] == ["b (DOWN)"]


def test_instances_not_up_before_the_start_are_handled_as_their_events() -> None:
    a, b = FakeInstance("a", RESTARTING, "died early"), FakeInstance("b")
    pool, owner = make(a, b)
    assert pool.idle == [b] and owner.calls == [("left", "a", "died early")]
    assert a.watcher is not None and b.watcher is not None


def test_every_instance_down_before_the_start_is_gone_at_once() -> None:
    pool, owner = make(FakeInstance("a", DOWN, "a gave up"), FakeInstance("b", DOWN, "b gave up"))
    assert pool.gone is not None and pool.gone.message == "model 'm' version 1 has no instance left: b gave up"
    assert owner.calls[-2:] == [("gone", pool.gone.message), ("on_down", owner, "b gave up")]


def test_a_pool_without_instances_is_gone_at_once() -> None:
    pool, owner = make()
    assert pool.gone is not None and pool.gone.message.endswith("no instance left: every instance stopped")
    assert [c[0] for c in owner.calls] == ["gone", "on_down"]


def test_health_events_become_messages_to_the_owner_until_the_stop() -> None:
    a = FakeInstance("a")
    pool, owner = make(a)
    assert a.watcher is not None
    a.watcher(a, RESTARTING, "died")  # the hub: only a message, handled later by the owner
    assert owner.told == [InstanceHealth(a, RESTARTING, "died")] and pool.idle == [a]  # type: ignore[arg-type]
    owner.stopped = True
    a.watcher(a, UP, "")  # the owner stopped meanwhile: dropped
    pool.stop()
    assert a.watcher is None


@pytest.mark.parametrize(("name", "text"), [("scheduler:m:1", "model 'm' version 1"),
                                            ("scheduler:a:b:12", "model 'a:b' version 12")])
def test_version_text(name: str, text: str) -> None:
    assert version_text(name) == text

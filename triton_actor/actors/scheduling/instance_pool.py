"""InstancePool: which instances of one model version can take a batch now, as their health changes.

Owner: one scheduler actor (:class:`~.scheduler.SchedulerActor`, :class:`~.sequence_scheduler.
SequenceSchedulerActor`). Only its handlers call the pool, and the pool calls back into it (:class:`PoolOwner`)
from those same handlers. The instances' watchers run in the hub and only tell the owner
:class:`InstanceHealth` (:meth:`InstancePool._watched`), so a health change is handled in order with the
owner's other messages.

State: ``idle`` (UP and not running a batch; the owner reads it, :meth:`~InstancePool.take` and
:meth:`~InstancePool.release` change it), the running instances, the instances out of the pool with their
health (RESTARTING or DOWN, see actors/scheduling/instance.py), and ``gone`` (every instance is DOWN: the error each
request is answered with from then on).

Invariants: an instance is idle or running or neither, never both; one out of the pool is never idle; once
``gone`` is set nothing is idle and ``gone`` stays (DOWN is for good: loading the model again brings fresh
instances); the owner's ``pool_gone`` and the model actor's ``on_down`` run once, in that order.

Transitions (:meth:`~InstancePool.on_health`): not UP → the instance leaves the pool (a dead instance answers
at once, so it would look idle and draw the work: with two instances and one dead, half the requests failed)
and ``instance_left`` lets the owner end what only it held; the last one DOWN → ``gone``. UP again → it rejoins
the pool (idle now, or once its running batch is answered) and ``instance_joined`` lets the owner dispatch.
An instance that is not UP when the pool starts is handled as that event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import TritonError
from ...runtime.kernel import ActorRef
from .instance import DOWN, UP, ModelInstance

log = logging.getLogger(__name__)

Down = Callable[[Any, str], None]  # on_down(scheduler, reason): every instance is DOWN (any thread's hub callback)


@dataclass(frozen=True, slots=True)
class InstanceHealth:
    """Event from an instance's watcher (hub): it is UP, RESTARTING or DOWN (see actors/scheduling/instance.py)."""

    instance: ModelInstance
    health: str
    reason: str


class PoolOwner(Protocol):
    """The scheduler that owns a pool. The pool calls these from the owner's own handlers."""

    name: str
    ref: ActorRef

    def instance_joined(self, instance: ModelInstance) -> None:
        """Back in the pool (UP again): dispatch what waits."""

    def instance_left(self, instance: ModelInstance, reason: str) -> None:
        """Out of the pool (RESTARTING or DOWN): end what only this instance could run."""

    def pool_gone(self, error: TritonError) -> None:
        """Every instance is DOWN: fail what waits with ``error`` (once, before the model actor is told)."""


class InstancePool:
    """The instances of one version: idle, running, out of the pool; see the module docstring."""

    __slots__ = ("idle", "gone", "_owner", "_instances", "_running", "_out", "_on_down")

    def __init__(self, owner: PoolOwner, instances: list[ModelInstance], on_down: Down | None = None) -> None:
        self._owner = owner
        self._instances = instances
        self.idle: list[ModelInstance] = instances[::-1]  # take() pops the last: the first instance first
        self._running: set[ModelInstance] = set()
        self._out: dict[ModelInstance, str] = {}  # not in the pool → its health
        self._on_down = on_down
        self.gone: TritonError | None = None

    def start(self) -> None:
        """The owner's ``on_start``: watch every instance; one not UP already changed before the watch."""
        for inst in self._instances:
            inst.watch(self._watched)
            if inst.health != UP:
                self.on_health(InstanceHealth(inst, inst.health, inst.reason))
        self._check_gone("every instance stopped")  # no instance at all

    def stop(self) -> None:
        """The owner's ``on_stop``: no more health events."""
        for inst in self._instances:
            inst.watch(None)

    def _watched(self, instance: ModelInstance, health: str, reason: str) -> None:
        """Hub (an instance's watcher): health events become messages, handled in order with the rest."""
        try:
            self._owner.ref.tell(InstanceHealth(instance, health, reason))
        except TritonError:
            pass  # the owner stopped meanwhile: nobody routes to this version any more

    @property
    def busy(self) -> int:
        """Instances running a batch."""
        return len(self._running)

    def take(self, instance: ModelInstance | None = None) -> ModelInstance:
        """An idle instance (``instance``, else the one freed last) runs a batch from now on."""
        if instance is None:
            instance = self.idle.pop()
        else:
            self.idle.remove(instance)
        self._running.add(instance)
        return instance

    def release(self, instance: ModelInstance) -> None:
        """Its batch is answered (or was never run): idle again, unless it left the pool meanwhile."""
        self._running.discard(instance)
        if instance not in self._out and self.gone is None:
            self.idle.append(instance)

    def on_health(self, msg: InstanceHealth) -> None:
        """The owner's ``on_InstanceHealth``: an instance left the pool (RESTARTING, DOWN) or came back (UP)."""
        inst = msg.instance
        if msg.health == UP:
            if self._out.pop(inst, None) is not None and self.gone is None:
                if inst not in self._running:
                    self.idle.append(inst)
                log.info("scheduler %s: instance %s is back in the pool", self._owner.name, inst.name)
                self._owner.instance_joined(inst)
            return
        self._out[inst] = msg.health
        if inst in self.idle:
            self.idle.remove(inst)
        log.warning("scheduler %s: instance %s left the pool (%s): %s", self._owner.name, inst.name, msg.health,
                    msg.reason)
        self._owner.instance_left(inst, msg.reason)
        self._check_gone(msg.reason or "every instance stopped")

    def _check_gone(self, reason: str) -> None:
        """Every instance DOWN: nothing will run again; the owner fails what waits, the model actor is told."""
        if self.gone is not None or any(self._out.get(i) != DOWN for i in self._instances):
            return
        self.gone = TritonError.unavailable(f"{version_text(self._owner.name)} has no instance left: {reason}")
        self.idle.clear()
        self._owner.pool_gone(self.gone)
        if self._on_down is not None:
            self._on_down(self._owner, reason)

    def status(self) -> dict[str, object]:
        """The status page's part: instance names, how many run a batch, which are out and why."""
        return {"busy_instances": len(self._running), "instances": [i.name for i in self._instances],
                "down_instances": sorted(f"{i.name} ({health})" for i, health in self._out.items())}


def version_text(name: str) -> str:
    """``model 'm' version 1`` from a scheduler's name ``scheduler:m:1`` (actors/model/version.py names it)."""
    model, _, version = name.partition(":")[2].rpartition(":")
    return f"model '{model}' version {version}"

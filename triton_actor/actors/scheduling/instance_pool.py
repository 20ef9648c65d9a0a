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

Rate limiting (``--rate-limit=execution_count``, :mod:`.rate_limiter`): an instance whose group names
resources is idle only while it holds them. Otherwise it is *cold* (UP, not running, holding nothing) or
*staged* (waiting in the limiter's line). The owner says after each dispatch how much work it could still
start (:meth:`~InstancePool.demand`, :meth:`~InstancePool.demand_each`); the pool stages cold instances for
it, withdraws what is no longer wanted, and gives back the resources of idle instances with nothing to run.
A grant that comes later reaches the owner as a :class:`Granted` message (handled in order, like health),
and the instance becomes idle then. After its batch an instance gives its resources back and is cold again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import TritonError
from ...runtime.kernel import ActorRef
from .instance import DOWN, UP, ModelInstance
from .rate_limiter import RateLimiter, Waiter

log = logging.getLogger(__name__)

Down = Callable[[Any, str], None]  # on_down(scheduler, reason): every instance is DOWN (any thread's hub callback)


@dataclass(frozen=True, slots=True)
class InstanceHealth:
    """Event from an instance's watcher (hub): it is UP, RESTARTING or DOWN (see actors/scheduling/instance.py)."""

    instance: ModelInstance
    health: str
    reason: str


@dataclass(frozen=True, slots=True)
class Granted:
    """From the rate limiter (hub): ``instance`` holds its resources now."""

    instance: ModelInstance


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

    __slots__ = ("idle", "gone", "limited", "_owner", "_instances", "_running", "_out", "_on_down", "_limiter",
                 "_waiters", "_cold", "_staged", "_owed")

    def __init__(self, owner: PoolOwner, instances: list[ModelInstance], on_down: Down | None = None,
                 limiter: RateLimiter | None = None, waiters: dict[ModelInstance, Waiter] | None = None) -> None:
        self._owner = owner
        self._instances = instances
        self._limiter = limiter
        self._waiters = waiters or {}  # the rate-limited instances (their groups name resources)
        self.limited = limiter is not None and bool(self._waiters)
        # take() pops the last: the first instance first; a rate-limited one is idle only while it holds resources
        self.idle: list[ModelInstance] = [i for i in instances[::-1] if i not in self._waiters]
        self._cold: list[ModelInstance] = [i for i in instances[::-1] if i in self._waiters]
        self._staged: set[ModelInstance] = set()
        self._owed = False  # resources were given back: the limiter's line moves at the next demand
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
        """The owner's ``on_stop``: no more health events; the instances leave the rate limiter."""
        for inst in self._instances:
            inst.watch(None)
        if self._limiter is not None and self._waiters:
            self._limiter.unregister(list(self._waiters.values()))
            self._staged.clear()

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

    def release(self, instance: ModelInstance, executed: bool = True) -> None:
        """Its batch is answered (or was never run: ``executed`` False): idle again, unless it left the pool
        meanwhile; a rate-limited instance gives its resources back and is cold."""
        self._running.discard(instance)
        waiter = self._waiters.get(instance)
        if waiter is not None:
            assert self._limiter is not None
            # the owner's dispatch comes next: it stages the instance again if it has more work, and the
            # demand then lets the line move (PoolScheduler's completions always dispatch)
            self._limiter.give_back(waiter, executed, allocate=False)
            self._owed = True
            if instance not in self._out and self.gone is None:
                self._cold.append(instance)
            return
        if instance not in self._out and self.gone is None:
            self.idle.append(instance)

    # -- rate limiting (only for a pool with rate-limited instances: ``limited``) ----------------------
    def demand(self, work: int) -> bool:
        """The owner could start ``work`` more batches on any instance: stage cold instances for what the
        idle ones do not cover, withdraw staged ones beyond it; with no work, idle instances give their
        resources back. True when an instance got its resources at once (the owner dispatches again)."""
        want = max(0, work - len(self.idle)) if work > 0 else 0
        for inst in list(self._staged)[:max(0, len(self._staged) - want)]:
            self._withdraw(inst)
        now, asked = False, len(self._staged)
        while want > asked and self._cold:  # an instance granted at once is idle, not staged: count the asks
            now |= self._stage(self._cold.pop())
            asked += 1
        if work <= 0:
            self._cool_idle(lambda inst: True)
        return self._settle(now)

    def demand_each(self, wants: Callable[[ModelInstance], bool]) -> bool:
        """The owner has work that only some instances can run (a sequence's slot): stage the cold instances
        ``wants``, withdraw the staged ones it no longer does, and idle ones it does not give back."""
        now = False
        for inst in [i for i in self._staged if not wants(i)]:
            self._withdraw(inst)
        for inst in [i for i in self._cold if wants(i)]:
            self._cold.remove(inst)
            now |= self._stage(inst)
        self._cool_idle(lambda inst: not wants(inst))
        return self._settle(now)

    def _settle(self, now: bool) -> bool:
        """After a demand: the line moves for what this pool gave back since the last one."""
        if self._owed:
            self._owed = False
            assert self._limiter is not None
            self._limiter.allocate()
        return now

    def granted(self, msg: Granted) -> bool:
        """The owner's ``on_Granted``: the instance is idle now (True), or gives back a grant it no longer wants."""
        inst = msg.instance
        if inst in self._staged:
            self._staged.discard(inst)
            if inst not in self._out and self.gone is None:
                self.idle.append(inst)
                return True
        waiter = self._waiters.get(inst)
        if waiter is not None and waiter.held and inst not in self._running and inst not in self.idle:
            assert self._limiter is not None
            self._limiter.give_back(waiter, executed=False)
        return False

    def _stage(self, inst: ModelInstance) -> bool:
        assert self._limiter is not None
        self._staged.add(inst)
        if self._limiter.ask(self._waiters[inst], lambda: self._tell_granted(inst)):
            self._staged.discard(inst)
            self.idle.append(inst)
            return True
        return False

    def _tell_granted(self, inst: ModelInstance) -> None:
        """Hub (the limiter, in another scheduler's handler or this one's): the grant becomes a message."""
        try:
            self._owner.ref.tell(Granted(inst))
        except TritonError:  # the owner stopped meanwhile
            assert self._limiter is not None
            self._limiter.give_back(self._waiters[inst], executed=False)

    def _withdraw(self, inst: ModelInstance) -> None:
        """The owner no longer wants ``inst`` staged: out of the line, cold again; if its grant is already on
        the way (the :class:`Granted` message), it is idle (and gives its resources back when unwanted)."""
        assert self._limiter is not None
        self._staged.discard(inst)
        waiter = self._waiters[inst]
        if waiter.held:
            self.idle.append(inst)
            return
        self._limiter.withdraw(waiter)
        self._cold.append(inst)

    def _cool_idle(self, unwanted: Callable[[ModelInstance], bool]) -> None:
        """Idle rate-limited instances the owner has no work for give their resources back."""
        assert self._limiter is not None
        for inst in [i for i in self.idle if i in self._waiters and unwanted(i)]:
            self.idle.remove(inst)
            self._limiter.give_back(self._waiters[inst], executed=False)
            self._cold.append(inst)

    def on_health(self, msg: InstanceHealth) -> None:
        """The owner's ``on_InstanceHealth``: an instance left the pool (RESTARTING, DOWN) or came back (UP)."""
        inst = msg.instance
        if msg.health == UP:
            if self._out.pop(inst, None) is not None and self.gone is None:
                if inst not in self._running:
                    (self._cold if inst in self._waiters else self.idle).append(inst)
                log.info("scheduler %s: instance %s is back in the pool", self._owner.name, inst.name)
                self._owner.instance_joined(inst)
            return
        self._out[inst] = msg.health
        if inst in self.idle:
            self.idle.remove(inst)
            if inst in self._waiters:
                assert self._limiter is not None
                self._limiter.give_back(self._waiters[inst], executed=False)
        self._leave_limiter_line(inst)
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
        for inst in self._instances:
            self._leave_limiter_line(inst)
        self._owner.pool_gone(self.gone)
        if self._on_down is not None:
            self._on_down(self._owner, reason)

    def _leave_limiter_line(self, inst: ModelInstance) -> None:
        """Out of the pool: not cold, not staged (what it held idle was given back by the caller)."""
        if inst in self._cold:
            self._cold.remove(inst)
        if inst in self._staged:
            self._staged.discard(inst)
            assert self._limiter is not None
            waiter = self._waiters[inst]
            if waiter.held:  # granted, the message on its way
                self._limiter.give_back(waiter, executed=False)
            else:
                self._limiter.withdraw(waiter)

    def status(self) -> dict[str, object]:
        """The status page's part: instance names, how many run a batch, which are out and why."""
        return {"busy_instances": len(self._running), "instances": [i.name for i in self._instances],
                "down_instances": sorted(f"{i.name} ({health})" for i, health in self._out.items())}


def version_text(name: str) -> str:
    """``model 'm' version 1`` from a scheduler's name ``scheduler:m:1`` (actors/model/version.py names it)."""
    model, _, version = name.partition(":")[2].rpartition(":")
    return f"model '{model}' version {version}"

"""PoolScheduler: what the two schedulers that own an :class:`~.instance_pool.InstancePool` share.

The default / dynamic batcher (:class:`~.scheduler.SchedulerActor`) and the sequence batcher
(:class:`~.sequence_scheduler.SequenceSchedulerActor`) differ in their policy (a
:class:`~.batch_queue.BatchQueue`, or :class:`~.sequence_slots.SequenceSlots`) and agree on the rest,
which lives here once: the pool's health events and its ``pool_gone``, the replies failed when no
instance is left (failure reason OTHER) or the queue is full (REJECTED), ``Drain`` answered once nothing waits or runs, the status
page's ``GetStatus``, the timer's ``Wake``, and what ``on_stop`` owes the requests still waiting.

A base class rather than a helper both own: most of the shared part is message handlers
(``on_InstanceHealth``, ``on_Drain``, ``on_GetStatus``, ``on_Wake``) and the :class:`~.instance_pool.PoolOwner`
calls, which a helper would leave as a delegating method in each scheduler. A subclass supplies its
policy through four methods: :meth:`_waiting` (how many requests wait), :meth:`_clear_waiting` (take them
all out), :meth:`_dispatch` (run what can run) and the pool's ``instance_joined`` / ``instance_left``.

Owner: the subclass actor; everything here runs in its handlers. State owned here: the pool, the
statistics, the clock, the waiting drains, the count of requests running, the :class:`~.wake_timer.WakeTimer`.
Failure: as the subclass says; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TritonError
from ..statistics import VersionStats
from .instance import ModelInstance
from .instance_pool import Down, InstanceHealth, InstancePool
from .kernel import InlineActor, Reply
from .scheduler_messages import Drain, Enqueue, GetStatus
from .wake_timer import Wake, WakeTimer


class PoolScheduler(InlineActor):
    """The part of a version's scheduler that is not its policy; see the module docstring."""

    def __init__(self, name: str, instances: list[ModelInstance], stats: VersionStats,
                 clock: Callable[[], int], on_down: Down | None) -> None:
        super().__init__(name)
        self._pool = InstancePool(self, instances, on_down)
        self._stats = stats
        self._clock = clock
        self._drains: list[Reply[None]] = []
        self._running = 0  # requests in the batches being executed (the status page)
        self._timer = WakeTimer(self.ref.tell)  # the policy's deadlines

    # -- the subclass's policy --------------------------------------------------------------------
    def _waiting(self) -> int:
        """Requests queued, not running yet."""
        raise NotImplementedError

    def _clear_waiting(self) -> list[Enqueue]:
        """Take every waiting request out (the pool is gone, or the actor stops)."""
        raise NotImplementedError

    def _dispatch(self) -> None:
        """Run what can run on the idle instances; arm the timer for the policy's next deadline."""
        raise NotImplementedError

    # -- the pool's calls (from on_InstanceHealth) ------------------------------------------------
    def instance_joined(self, instance: ModelInstance) -> None:
        self._dispatch()

    def pool_gone(self, error: TritonError) -> None:
        self._fail(self._clear_waiting(), error)
        self._maybe_drained()

    # -- messages ---------------------------------------------------------------------------------
    def on_start(self) -> None:
        self._pool.start()

    def on_InstanceHealth(self, msg: InstanceHealth) -> None:
        self._pool.on_health(msg)

    def on_Wake(self, msg: Wake) -> None:
        self._timer.woke(msg)
        self._dispatch()

    def on_GetStatus(self, _msg: GetStatus) -> dict[str, object]:
        """The status page's view (live_status.py), as every scheduler answers it."""
        return {"stats": self._stats.snapshot(), "queued": self._waiting(), "running": self._running,
                **self._pool.status()}

    def on_Drain(self, msg: Drain) -> None:
        self._drains.append(msg.reply)
        self._maybe_drained()

    def on_stop(self) -> None:
        """Nobody waits forever: waiting requests fail UNAVAILABLE, drains are answered."""
        self._timer.stop()
        self._pool.stop()
        error = TritonError.unavailable(f"model version '{self.name}' is unloading")
        for item in self._clear_waiting():
            item.reply.fail(error)
        for reply in self._drains:
            reply.set(None)
        self._drains.clear()

    # -- shared steps -----------------------------------------------------------------------------
    def _refused_gone(self, msg: Enqueue) -> bool:
        """Every instance is DOWN (until the model actor publishes the version's new state): fail it."""
        if self._pool.gone is None:
            return False
        self._fail([msg], self._pool.gone)
        return True

    def _fail(self, items: list[Enqueue], error: TritonError) -> None:
        """No instance to run them: failure reason OTHER, as Triton counts what fails in the core outside
        the queue policy."""
        now = self._clock()
        for item in items:
            self._stats.record_failure(now - item.start_ns)
            item.reply.fail(error)

    def _reject(self, item: Enqueue, error: TritonError) -> None:
        """The queue refused it (full): failure reason REJECTED, as Triton counts its queue policy's refusals,
        whether the request is new or one its model rescheduled."""
        self._stats.record_failure(self._clock() - item.start_ns, "REJECTED")
        item.reply.fail(error)

    def _maybe_drained(self) -> None:
        if self._drains and not self._waiting() and not self._pool.busy:
            for reply in self._drains:
                reply.set(None)
            self._drains.clear()

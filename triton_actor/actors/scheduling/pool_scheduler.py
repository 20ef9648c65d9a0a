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

Inline batches (a model promoted to run in the calling greenlet, actors/scheduling/instance.py): a batch that
finishes at once is answered at once, and that answer dispatches the next queued batch, so a long queue
used to run back to back in one hub turn (the promotion of a model with 1952 requests queued held the
hub 29 ms; the monitor's ``GEVENT_MAX_BLOCKING_TIME`` saw it). At most :data:`INLINE_PER_TURN` inline
batches start in one hub turn (:meth:`PoolScheduler._turn_spent`); then dispatch stops and the timer is
armed with no delay, so the hub polls its sockets before the next ones start, as the ensemble starts at
most 64 steps a turn. A turn is the event loop's time (``loop.now()``: it moves only when the loop runs),
so separate requests in separate turns never wait; the count costs a ``loop.now()`` and an increment
per inline batch.

Owner: the subclass actor; everything here runs in its handlers. State owned here: the pool, the
statistics, the clock, the waiting drains, the count of requests running, the :class:`~...runtime.wake_timer.WakeTimer`.
Failure: as the subclass says; nothing here raises.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import gevent

from ...errors import TritonError
from ...metrics.statistics import VersionStats
from ...runtime.kernel import InlineActor, Reply
from ...runtime.wake_timer import Wake, WakeTimer
from .instance import ModelInstance
from .instance_pool import Down, Granted, InstanceHealth, InstancePool
from .messages import Drain, Enqueue, GetStats, GetStatus
from .rate_limiter import RateLimiter, Waiter

# Inline batches started in one hub turn (~15 µs each for a small Python model: ~1 ms of hub time).
INLINE_PER_TURN = 64
Turn = Callable[[], Hashable]  # the current hub turn's id (the loop's time; tests pass a manual one)
# the server's rate limiter and this version's rate-limited instances (--rate-limit=execution_count)
Limited = tuple[RateLimiter, dict[ModelInstance, Waiter]]


class PoolScheduler(InlineActor):
    """The part of a version's scheduler that is not its policy; see the module docstring."""

    def __init__(self, name: str, instances: list[ModelInstance], stats: VersionStats,
                 clock: Callable[[], int], on_down: Down | None, inline_per_turn: int = INLINE_PER_TURN,
                 turn: Turn | None = None, limited: Limited | None = None) -> None:
        super().__init__(name)
        self._pool = InstancePool(self, instances, on_down, *(limited or (None, None)))
        self._stats = stats
        self._clock = clock
        self._drains: list[Reply[None]] = []
        self._running = 0  # requests in the batches being executed (the status page)
        self._timer = WakeTimer(self.ref.tell)  # the policy's deadlines, the next hub turn
        self._per_turn = inline_per_turn
        self._turn = turn or gevent.get_hub().loop.now
        self._turn_id: Hashable = None  # the turn of the last inline batch
        self._inline_runs = 0  # inline batches started in that turn (since the last Wake)

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

    def direct(self, item: Enqueue) -> bool:
        """Run ``item`` on the caller's stack instead of sending it (the default scheduler's fast path);
        False: the caller sends it as an :class:`Enqueue`, as the sequence batcher always wants."""
        return False

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

    def on_Granted(self, msg: Granted) -> None:
        """The rate limiter gave an instance its resources: run what waits for it."""
        if self._pool.granted(msg):
            self._dispatch()

    def on_Wake(self, msg: Wake) -> None:
        self._timer.woke(msg)
        self._inline_runs = 0  # a timer fired: the hub runs this turn
        self._dispatch()

    def on_GetStats(self, _msg: GetStats) -> dict[str, object]:
        snap = self._stats.snapshot()
        snap["pending"] = self._waiting()  # queued, not yet executing (nv_inference_pending_request_count)
        return snap

    def on_GetStatus(self, _msg: GetStatus) -> dict[str, object]:
        """The status page's view (plane/live_status.py), as every scheduler answers it."""
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

    def _count_inline(self, instance: ModelInstance) -> None:
        """A batch goes to ``instance``: count it in this hub turn when it runs inline (it may finish on
        this stack, and its answer dispatches the next one)."""
        if instance.inline:
            turn = self._turn()
            if turn != self._turn_id:
                self._turn_id, self._inline_runs = turn, 0
            self._inline_runs += 1

    def _turn_spent(self, now: int) -> bool:
        """Whether this hub turn started its share of inline batches; if so the timer wakes the actor in
        the next turn (no delay) and dispatch stops until then."""
        if self._inline_runs < self._per_turn or self._turn() != self._turn_id:
            return False  # a count of an earlier turn starts again at the next inline batch
        self._timer.arm(now, 0)
        return True

    def _maybe_drained(self) -> None:
        if self._drains and not self._waiting() and not self._pool.busy:
            for reply in self._drains:
                reply.set(None)
            self._drains.clear()

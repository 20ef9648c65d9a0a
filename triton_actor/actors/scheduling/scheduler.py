"""SchedulerActor: the queue of one model version and the choice of which idle instance runs what.

An :class:`InlineActor`: its handlers never block, so while fast paths are on a message is handled on
the sender's stack when the actor is idle (no loop greenlet, no switch); with them off it is a plain
actor with its loop greenlet. Messages: those of every scheduler (:mod:`.messages`: Enqueue,
Drain, GetStats, GetStatus), :class:`BatchDone` (event from an instance's completion, in the hub or the
caller), :class:`~.instance_pool.InstanceHealth` (event from an instance's watcher). A fast path skips
the messages for a request an idle, promoted instance can run at once (:meth:`SchedulerActor.direct`:
the version handle calls it before it sends the Enqueue).
State owned: the request queue, the :class:`~.instance_pool.InstancePool` of the version's instances
(:class:`ModelInstance`, single-owner hub objects: only this actor calls them once it started), the
version's :class:`VersionStats` (the pool, the statistics, drains, ``GetStatus`` and ``Wake`` are
:class:`~.pool_scheduler.PoolScheduler`'s, shared with the sequence batcher; this class is the policy).
Failure: a backend error fails only the requests of that batch; the instance goes back to idle. An
error in a handler fails that message's reply. Stopped: queued requests fail UNAVAILABLE, a batch
that finishes afterwards still answers its requests (``_answer``).

Instances: the :class:`~.instance_pool.InstancePool` (idle, running, out of the pool as their health
changes). Queued work waits for the instances that are UP. Once every instance is DOWN (for good) the
queue fails UNAVAILABLE (failure reason OTHER: Triton's REJECTED is a scheduler's queue timeout), so do
new requests, and ``on_down(self, reason)`` tells the model actor, which owns the version's ready state.

Policy: the version's :class:`~.batch_queue.BatchQueue` (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md) decides what runs next
whenever an instance is idle; without a scheduling block each request runs alone. No idle instance:
requests wait in the queue (backpressure), so N instances keep at most N batches in flight. Time
enters through one :class:`~...runtime.wake_timer.WakeTimer` (the batcher's delay, request timeouts), which tells
the actor :class:`~...runtime.wake_timer.Wake`; with ``preserve_ordering`` a :class:`~.reply_order.ReplyOrder`
releases replies in the order the requests were dispatched.

Rescheduling: a backend result :data:`~...backends.base.RESCHEDULE` (a Python model released the
request with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``) puts the request back in the queue as a new
arrival instead of answering it; its reply completes when a later execution answers it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
from gevent import getcurrent

from ...backends.base import RESCHEDULE
from ...errors import TritonError
from ...inference import InferRequest, InferResponse
from ...metrics.statistics import VersionStats
from ...observability.tracing import VersionTrace
from ...runtime import fastpath
from ...runtime.bridge import CancelWatch
from ...runtime.kernel import Reply
from .batch_queue import BatchPolicy, BatchQueue, timeout_error
from .instance import ModelInstance, Timings
from .instance_pool import Down
from .messages import Drain, Enqueue, GetStats, GetStatus
from .pool_scheduler import INLINE_PER_TURN, Limited, PoolScheduler, Turn
from .reply_order import ReplyOrder

__all__ = ["BatchDone", "Drain", "Enqueue", "GetStats", "GetStatus", "SchedulerActor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchDone:
    instance: ModelInstance
    items: list[Enqueue]
    dispatch_ns: int
    ok: bool
    value: Any  # (results, timings) or the error


class SchedulerActor(PoolScheduler):
    """Default and dynamic-batching scheduler of one model version."""

    def __init__(self, name: str, instances: list[ModelInstance], stats: VersionStats,
                 policy: BatchPolicy | None = None, clock: Callable[[], int] = time.perf_counter_ns,
                 trace: VersionTrace | None = None, on_down: Down | None = None,
                 inline_per_turn: int = INLINE_PER_TURN, turn: Turn | None = None, limited: Limited | None = None) -> None:
        super().__init__(name, instances, stats, clock, on_down, inline_per_turn, turn, limited)  # its timer: the batcher's delay, queue timeouts
        self._trace = trace or _NO_TRACE  # observability/tracing.py: ``.on`` is read once per finished batch
        self._policy = policy or BatchPolicy()
        self._queue: BatchQueue[Enqueue] = BatchQueue(self._policy)
        self._batching = self._policy.max_batch_size > 0
        # no batching and no queue timeouts: a request that finds an idle instance and nobody waiting runs at once
        self._direct = fastpath.enabled and not self._batching and not self._queue.timed
        self._ragged = self._policy.ragged_inputs
        self._order: ReplyOrder[Enqueue] | None = ReplyOrder(_complete) if self._policy.preserve_ordering else None
        # ``direct``'s standing conditions (those of ``_direct``, and neither ordering nor rate limiting)
        self._straight = self._direct and self._order is None and not self._pool.limited
        self._hub = gevent.get_hub()

    # -- the policy's part of PoolScheduler --------------------------------------------------------
    def _waiting(self) -> int:
        return len(self._queue)

    def _clear_waiting(self) -> list[Enqueue]:
        return self._queue.clear()

    def instance_left(self, instance: ModelInstance, reason: str) -> None:
        pass  # the queue is every instance's: the others take it

    # -- messages ---------------------------------------------------------------------------------
    def on_Enqueue(self, msg: Enqueue) -> None:
        if self._refused_gone(msg):
            return
        if self._direct and self._pool.idle and not len(self._queue) and self._inline_runs < self._per_turn:
            self._run(self._pool.take(), [msg])  # nothing waits and an instance is free: no queueing to do
            return
        if self._add(msg, msg.start_ns):
            self._dispatch()

    def direct(self, item: Enqueue) -> bool:
        """Run ``item`` now on the caller's stack with no message (a fast path); False: send it as an
        Enqueue. Taken only where :meth:`on_Enqueue` would run it at once on this stack anyway: no
        batching, queue timeouts, ordering or rate limiting for this version, nothing queued, the idle
        instance next in line runs inline, this hub turn's share of inline batches not spent, a caller
        that is not the hub, and an idle actor with nothing in its mailbox (``hold``), so the request
        overtakes none. The batch is answered as its :class:`BatchDone` would be (statistics, trace
        spans, replies); one the instance hands to its thread (an inline run that failed) is answered
        by that BatchDone, handled once the actor is no longer held."""
        idle = self._pool.idle
        if (not self._straight or not idle or not idle[-1].inline or self._queue.size
                or self._inline_runs >= self._per_turn or item.reply.ready() or getcurrent() is self._hub
                or not self.hold()):
            return False
        try:
            instance = idle[-1]  # left in the idle list while the actor is held (see step_direct)
            items = [item]
            dispatch_ns = self._clock()
            self._count_inline(instance)
            # with_cancellation's for one request of an inline instance (never one told of cancellations)
            requests = [_with_probe(item.request, item.reply.ready) if instance.observes_cancellation else item.request]
            left = [False]  # whether the batch left this stack and took its instance
            value = instance.run_here(requests, functools.partial(self._direct_left, instance, items, dispatch_ns, left))
            if value is None:  # answered later, by the instance's thread
                if not left[0]:
                    self._take(instance, left)
            else:
                result = value[0][0]
                if result is RESCHEDULE:
                    self._take(instance, left)
                    self._batch_done(instance, items, dispatch_ns, True, value)
                else:
                    self._answer_one(instance, item, dispatch_ns, result, value[1])
                if self._queue.size or self._drains:  # a request its model rescheduled, a waiting drain
                    self._dispatch()
        except Exception as e:  # a bug of ours: to the request, as a handler's error goes to its message's reply
            log.exception("scheduler %s: a direct run failed", self.name)
            item.reply.fail(e)
        finally:
            self.unhold()
        return True

    def step_direct(self, request: InferRequest, batch: int, new_reply: Callable[[], Reply[InferResponse]]) -> Any:
        """:meth:`direct` for a step of an ensemble's chain (``ensemble_chain.py``), which needs neither the
        Enqueue nor a reply while the step's model answers on this stack: its response then; a reply
        (``new_reply()``) when the batch left the stack (an inline run that failed goes to the thread;
        a request its model rescheduled); None when not taken (the caller enqueues the step). Taken
        where :meth:`direct` is, and untraced (a traced step goes through :meth:`direct`). The queue
        time counted is none: the request never waited (one clock read for both).

        The instance stays in the pool's idle list while it runs here: the actor is held, so until
        ``unhold`` nothing else takes an instance, changes the pool (health is a message) or reads
        the running count (a direct run of another greenlet, while this model yields, finds the actor
        held and sends its message). A batch that leaves the stack takes the instance then
        (``_take``), as its completion gives it back."""
        idle = self._pool.idle
        if (not self._straight or not idle or not idle[-1].inline or self._queue.size or self._trace.on
                or self._inline_runs >= self._per_turn or getcurrent() is self._hub or not self.hold()):
            return None
        try:
            instance = idle[-1]
            start = self._clock()
            turn = self._turn()  # _count_inline's, for an instance known to run inline
            if turn != self._turn_id:
                self._turn_id, self._inline_runs = turn, 0
            self._inline_runs += 1
            later: list[Any] = [request, batch, start, None, new_reply]  # what the batch needs if it leaves this stack
            value = instance.run_here([request], functools.partial(self._step_left, instance, later))
            if value is None:  # answered later, by the instance's thread
                if later[3] is None:
                    self._take(instance, None)
                    later[3] = new_reply()
                return later[3]
            result = value[0][0]
            if result is RESCHEDULE:
                self._take(instance, None)
                reply = new_reply()
                self._batch_done(instance, [Enqueue(request, batch, reply, start)], start, True, value)
                if len(self._queue) or self._drains:
                    self._dispatch()
                return reply
            timings = value[1]
            self._stats.record_success(batch, self._clock() - start, 0, timings, True)
            result.timings = (0, *timings)  # a chain has no decoupled step: an InferResponse
            if self._drains:
                self._dispatch()
            return result
        except Exception as e:  # a bug of ours: to the step, as a handler's error goes to its message's reply
            log.exception("scheduler %s: a direct step failed", self.name)
            reply = new_reply()
            reply.fail(e)
            return reply
        finally:
            self.unhold()

    def _take(self, instance: ModelInstance, left: list[bool] | None) -> None:
        """A direct run's batch leaves the stack (the instance's thread answers it, or its request goes back
        to the queue): its instance is taken (running) until that completion releases it. Taken at once,
        not when the completion comes: after ``unhold`` another request must not find it idle."""
        if left is not None:
            left[0] = True
        self._pool.take(instance)
        self._running += 1

    def _direct_left(self, instance: ModelInstance, items: list[Enqueue], dispatch_ns: int, left: list[bool],
                     ok: bool, value: Any) -> None:
        """The completion of a :meth:`direct` batch that left the stack (its instance taken now if the run was
        interrupted before ``direct`` saw it leave)."""
        if not left[0]:
            self._take(instance, left)
        self._completed(instance, items, dispatch_ns, ok, value)

    def _step_left(self, instance: ModelInstance, later: list[Any], ok: bool, value: Any) -> None:
        """The completion of a :meth:`step_direct` batch that left the stack, as :meth:`_direct_left` (to
        the step's kind of reply, made now when ``run_here`` called this before it returned: the run was
        interrupted, or the instance's thread had stopped and answered at once)."""
        request, batch, start, reply, new_reply = later
        if reply is None:  # done called on run_here's stack: interrupted, or the instance's thread is gone
            self._take(instance, None)
            reply = later[3] = new_reply()
        self._completed(instance, [Enqueue(request, batch, reply, start)], start, ok, value)

    def _answer_one(self, instance: ModelInstance, item: Enqueue, dispatch_ns: int, result: Any, timings: Timings) -> None:
        """:meth:`_batch_done` of a direct run's answered request (no requeue, no error: ``run_here`` hands
        a batch with an error to the thread), in one go: its statistics row, timings, trace, reply (its
        instance never left the idle list)."""
        try:
            now = self._clock()
            start = item.start_ns
            queue_ns = dispatch_ns - start
            self._stats.record_success(item.batch_size, now - start, queue_ns, timings, True)
            if type(result) is InferResponse:  # decoupled models answer None here
                result.timings = (queue_ns, *timings)
            if self._trace.on:
                self._trace.batch([item], [result], dispatch_ns, now, timings)
            item.reply.set(result)  # a direct run has no reply order (``_straight``)
        except Exception as e:
            log.exception("scheduler %s: answering a batch failed", self.name)
            item.reply.fail(TritonError.internal(f"instance '{instance.name}': {e!r}"))

    def _add(self, item: Enqueue, arrival_ns: int) -> bool:
        """Into the queue; a full queue refuses it (REJECTED, a rescheduled request as a new one)."""
        request = item.request
        key = _shape_key(request, self._ragged) if self._batching else None
        try:
            self._queue.add(item, item.batch_size, key, request.priority, request.timeout_us, arrival_ns)
        except TritonError as e:
            self._reject(item, TritonError(e.code, _prefix(request) + e.message))
            return False
        return True

    def on_BatchDone(self, msg: BatchDone) -> None:
        self._batch_done(msg.instance, msg.items, msg.dispatch_ns, msg.ok, msg.value)
        self._dispatch()

    def _batch_done(self, instance: ModelInstance, items: list[Enqueue], dispatch_ns: int, ok: bool,
                    value: Any) -> None:
        """Answer the batch and take the instance back. Whatever goes wrong answering (a backend that
        returned the wrong number of results, a bug of ours), every request of the batch is answered
        and the instance is idle again: an error here must not strand replies or an instance."""
        try:
            self._answer_batch(instance, items, dispatch_ns, ok, value)
        except Exception as e:
            log.exception("scheduler %s: answering a batch failed", self.name)
            error = TritonError.internal(f"instance '{instance.name}': {e!r}")
            for item in items:
                self._respond(item, False, error)  # those answered already stay answered
        finally:
            self._running -= len(items)
            self._pool.release(instance)

    def _answer_batch(self, instance: ModelInstance, items: list[Enqueue], dispatch_ns: int, ok: bool,
                      value: Any) -> None:
        now = self._clock()
        stats = self._stats
        if ok:
            results, timings = value
            first = results[0] if len(items) == 1 and len(results) == 1 else RESCHEDULE
            # the usual batch, one request answered: its execution and its success are counted in one
            single = first is not RESCHEDULE and not isinstance(first, BaseException)
            if not single:
                stats.record_execution(_batch_size(items), *timings)
            for item, result in zip(items, results, strict=True):
                if result is RESCHEDULE:
                    self._requeue(item)
                elif isinstance(result, BaseException):
                    stats.record_failure(now - item.start_ns, "BACKEND")
                    self._respond(item, False, result)
                else:
                    queue_ns = dispatch_ns - item.start_ns
                    stats.record_success(item.batch_size, now - item.start_ns, queue_ns, timings, single)
                    if type(result) is InferResponse:  # decoupled models answer None here
                        result.timings = (queue_ns, *timings)
                    self._respond(item, True, result)
            if self._trace.on:
                self._trace.batch(items, results, dispatch_ns, now, timings)
        else:
            stats.record_execution(_batch_size(items), 0, 0, 0)
            error = value if isinstance(value, TritonError) else TritonError.internal(
                f"instance '{instance.name}' failed: {value!r}")
            for item in items:
                stats.record_failure(now - item.start_ns, "BACKEND")
                self._respond(item, False, error)
            if self._trace.on:
                self._trace.batch(items, None, dispatch_ns, now, (0, 0, 0))

    def _requeue(self, item: Enqueue) -> None:
        """A request its model rescheduled: back into the queue (the dispatch after this batch
        picks it up), as a new arrival so a queue timeout does not expire it at once."""
        if self._order is not None:  # its place in the order is given up; it gets a new one when it runs again
            self._order.give_up(item)
        self._add(item, self._clock())

    def on_stop(self) -> None:
        """As every scheduler (queued requests fail, drains are answered), and held replies are released."""
        super().on_stop()
        if self._order is not None:
            self._order.flush()

    def on_dropped(self, message: object) -> None:
        """A completion that reached the mailbox after the stop (loop mode): still answer its requests."""
        if isinstance(message, BatchDone):
            _answer(message.items, message.ok, message.value)

    # -- policy -----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        self._dispatch_idle()
        # rate-limited instances run only holding their resources: ask for them for the batches that wait
        while self._pool.limited and self._pool.demand(self._batches_waiting()):
            self._dispatch_idle()

    def _batches_waiting(self) -> int:
        n = len(self._queue)
        return -(-n // self._policy.max_batch_size) if self._batching else n

    def _dispatch_idle(self) -> None:
        queue, idle, take = self._queue, self._pool.idle, self._pool.take
        if not len(queue) and not self._timer.armed:
            self._maybe_drained()
            return
        now = self._clock()
        wait: int | None = None
        while True:
            if not idle or not len(queue):
                self._expire(queue.expire(now), now)
                wait = queue.until_deadline(now)
                break
            if self._inline_runs >= self._per_turn and self._turn_spent(now):
                break  # the rest in the next hub turn
            decision = queue.poll(now)
            self._expire(decision.expired, now)
            if not decision.batch:
                wait = decision.wait_ns
                break
            self._run(take(), decision.batch)
        if wait is not None:
            self._timer.arm(now, wait)
        self._maybe_drained()

    def _run(self, instance: ModelInstance, items: list[Enqueue]) -> None:
        if _any_answered(items):  # answered before it ran: cancelled by its client
            now = self._clock()
            for item in items:
                if item.reply.ready():
                    self._stats.record_failure(now - item.start_ns, "CANCELED")
            items = [i for i in items if not i.reply.ready()]
            if not items:
                self._pool.release(instance, executed=False)
                return
        if self._order is not None:
            self._order.dispatched(items)
        dispatch_ns = self._clock()
        self._running += len(items)
        self._count_inline(instance)
        instance.execute(with_cancellation(instance, items), self._completion(instance, items, dispatch_ns))

    def _expire(self, items: list[Enqueue], now: int) -> None:
        for item in items:
            self._stats.record_failure(now - item.start_ns, "REJECTED")  # timed out in the queue
            item.reply.fail(timeout_error(_prefix(item.request)))

    def _respond(self, item: Enqueue, ok: bool, value: Any) -> None:
        """Complete one request's reply, or hold it until every earlier request is answered."""
        if self._order is None:
            _complete(item, ok, value)
        else:
            self._order.finished(item, ok, value)

    def _completion(self, instance: ModelInstance, items: list[Enqueue], dispatch_ns: int) -> Callable[[bool, Any], None]:
        """The hub-side callback of one batch: turn it into a BatchDone message for this actor (a partial,
        made in C: a direct run makes one per request and calls it only when its batch leaves the stack)."""
        return functools.partial(self._completed, instance, items, dispatch_ns)

    def _completed(self, instance: ModelInstance, items: list[Enqueue], dispatch_ns: int, ok: bool, value: Any) -> None:
        try:
            self.ref.tell(BatchDone(instance, items, dispatch_ns, ok, value))
        except TritonError:  # stopped meanwhile: still answer the requests that ran
            _answer(items, ok, value)


def _any_answered(items: list[Enqueue]) -> bool:
    """Whether a reply of the batch completed already (a loop: no generator per batch)."""
    for item in items:
        if item.reply.ready():
            return True
    return False


def _batch_size(items: list[Enqueue]) -> int:
    """The elements of a batch (most batches hold one request: no generator then)."""
    if len(items) == 1:
        return items[0].batch_size
    return sum(i.batch_size for i in items)


def with_cancellation(instance: ModelInstance, items: list[Enqueue]) -> list[InferRequest]:
    """The batch's requests; for a backend that looks (``observes_cancellation``: a Python model's
    ``request.is_cancelled()``), each carries a probe that turns true when its client cancels it while it
    runs. A reply completes only when the batch is answered, so one completed earlier was cancelled (the
    client reset its call or went away: the front end failed it with CANCELLED)."""
    if not instance.observes_cancellation:
        return [i.request for i in items]
    if len(items) == 1 and not instance.watches_cancellation:  # the usual batch (every direct run): no comprehension
        item = items[0]
        return [_with_probe(item.request, item.reply.ready)]
    if instance.watches_cancellation:  # a model in a process of its own: told (isolated.py), not polled
        return [_with_probe(i.request, CancelWatch(i.reply)) for i in items]
    return [_with_probe(i.request, i.reply.ready) for i in items]


_PROBE = InferRequest._fields.index("is_cancelled")


def _with_probe(request: InferRequest, probe: Any) -> InferRequest:
    """``request._replace(is_cancelled=probe)``: built from slices with ``fastpath.new_tuple`` (0.5 µs
    measured against ``_replace``'s 1.3, for every request a Python model runs)."""
    return fastpath.new_tuple(InferRequest, (*request[:_PROBE], probe, *request[_PROBE + 1:]))


class _NoTrace:
    on = False


_NO_TRACE: Any = _NoTrace()


def _complete(item: Enqueue, ok: bool, value: Any) -> None:
    if ok:
        item.reply.set(value)
    else:
        item.reply.fail(value)


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _answer(items: list[Enqueue], ok: bool, value: Any) -> None:
    """Complete the replies of a batch without the (stopped) scheduler."""
    results = value[0] if ok else [value if isinstance(value, BaseException) else TritonError.internal(repr(value))] * len(items)
    for item, result in zip(items, results, strict=True):
        if result is RESCHEDULE:
            item.reply.fail(TritonError.unavailable("the model is unloading: a rescheduled request was dropped"))
        elif isinstance(result, BaseException):
            item.reply.fail(result)
        else:
            item.reply.set(result)


def _shape_key(request: InferRequest, ragged: frozenset[str]) -> tuple[Any, ...]:
    """Requests batch together only when every input has the same non-batch shape (inputs that allow
    ragged batches excepted) and the same inputs are present, in whatever order the client listed them."""
    return tuple(sorted((name, None if name in ragged else t.shape[1:]) for name, t in request.inputs.items()))

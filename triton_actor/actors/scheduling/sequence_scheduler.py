"""SequenceSchedulerActor: the sequence batcher of one model version (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md).

An :class:`InlineActor` like :class:`~.scheduler.SchedulerActor`, with the same messages, so a
version handle queues to either the same way (:mod:`.messages`: Enqueue, Drain, GetStats),
:class:`_SeqBatchDone` (event from an instance's completion), :class:`~.instance_pool.InstanceHealth`
(event from an instance's watcher), :class:`~...runtime.wake_timer.Wake` (its timer). State owned: the
:class:`SequenceSlots` (which sequence holds which slot of which instance, the backlog, the queued
requests), the implicit state of each live sequence, the :class:`~.instance_pool.InstancePool`, the
version's statistics (those last two, drains, ``GetStatus`` and ``Wake`` through
:class:`~.pool_scheduler.PoolScheduler`, shared with the default scheduler).
Policy is in :mod:`.sequence_slots` (slots, backlog, direct / oldest batches, idle timeout) and
:mod:`.sequence_controls` (control and state tensors); this actor checks each request's sequence
fields with Triton's errors, adds the tensors, runs batches and answers them.
Failure: a backend error fails the requests of that batch; their sequences keep their slots until
their END or the idle timeout. Stopped: queued requests fail UNAVAILABLE. Instances: the
:class:`~.instance_pool.InstancePool`; one that leaves it (not UP) ends the sequences it held, their queued
requests fail UNAVAILABLE, new sequences go to the others; UP again, it takes sequences again. Every
instance DOWN: requests fail UNAVAILABLE and ``on_down`` tells the model actor (as the default scheduler).

``iterative_sequence`` (Triton 2.51 python backend): a request without a correlation id gets one
(1, 2, ...) and START; a backend result :data:`~...backends.base.RESCHEDULE` puts the request back at
the head of its sequence with neither START nor END (Triton's ``GenerativeSequencer``); the sequence
ends when its request is released for good. Unlike Triton 2.51, a client's END on that request does
not end the sequence before the request is released (2.51 then fails the rescheduled request with
"must specify the START flag").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backends.base import RESCHEDULE
from ...errors import Code, TritonError
from ...inference import InferInput, InferRequest, InferResponse
from ...metrics.statistics import VersionStats
from ...runtime.bridge import CancelWatch
from .instance import ModelInstance
from .instance_pool import Down
from .messages import Enqueue
from .pool_scheduler import INLINE_PER_TURN, Limited, PoolScheduler, Turn
from .sequence_controls import SequenceTensors
from .sequence_slots import SEQUENCE_END, SEQUENCE_START, SequenceSlots, Slot, SlotPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _SeqBatchDone:
    instance: ModelInstance
    batch: list[Slot[Enqueue]]
    dispatch_ns: int
    ok: bool
    value: Any  # (results, timings) or the error


class SequenceSchedulerActor(PoolScheduler):
    """Sequence batcher of one model version; see the module docstring."""

    def __init__(self, name: str, model: str, instances: list[ModelInstance], stats: VersionStats,
                 policy: SlotPolicy, tensors: SequenceTensors, decoupled: bool = False,
                 clock: Callable[[], int] = time.perf_counter_ns, on_down: Down | None = None,
                 inline_per_turn: int = INLINE_PER_TURN, turn: Turn | None = None, limited: Limited | None = None) -> None:
        super().__init__(name, instances, stats, clock, on_down, inline_per_turn, turn, limited)  # its timer: batch delays, idle sequences
        self._model = model
        self._index = {inst: i for i, inst in enumerate(instances)}  # the instance's slots in SequenceSlots
        self._policy = policy
        self._slots: SequenceSlots[Enqueue] = SequenceSlots(policy)
        self._tensors = tensors
        self._pad = not decoupled  # null requests for empty slots (a decoupled model has no answer for them)
        self._states: dict[int | str, dict[str, np.ndarray]] = {}
        self._next_id = 1

    # -- the policy's part of PoolScheduler --------------------------------------------------------
    def _waiting(self) -> int:
        return len(self._slots)

    def _clear_waiting(self) -> list[Enqueue]:
        self._states.clear()
        return self._slots.clear()

    def instance_joined(self, instance: ModelInstance) -> None:
        self._slots.open_instance(self._index[instance])
        self._dispatch()

    def instance_left(self, instance: ModelInstance, reason: str) -> None:
        """The sequences it held end; their queued requests fail."""
        ended, queued = self._slots.close_instance(self._index[instance])
        for corr_id in ended:
            self._states.pop(corr_id, None)
        self._fail(queued, TritonError.unavailable(f"instance '{instance.name}' holding the sequence stopped: {reason}"))
        self._dispatch()  # backlog sequences may have taken slots of the instances still up

    # -- messages ---------------------------------------------------------------------------------
    def on_Enqueue(self, msg: Enqueue) -> None:
        if self._refused_gone(msg):
            return
        try:
            msg = self._admit(msg)
            self._slots.add(msg, msg.request.correlation_id, msg.request.flags, msg.start_ns, self._model)
        except TritonError as e:
            if e.code == Code.UNAVAILABLE:  # the queue is full (SequenceSlots.add)
                self._reject(msg, e)
            else:  # not a sequence request Triton would take (INVALID_ARG)
                self._fail([msg], e)
            return
        self._dispatch()

    def on__SeqBatchDone(self, msg: _SeqBatchDone) -> None:
        self._running -= sum(1 for slot in msg.batch if slot.item is not None)
        try:
            self._answer_batch(msg)
        except Exception as e:
            log.exception("sequence scheduler %s: answering a batch failed", self.name)
            error = TritonError.internal(f"sequence batcher of '{self._model}': {e!r}")
            for slot in msg.batch:
                if slot.item is not None and not slot.item.reply.ready():
                    slot.item.reply.fail(error)
        finally:
            self._pool.release(msg.instance)
        self._dispatch()

    # -- requests ---------------------------------------------------------------------------------
    def _admit(self, msg: Enqueue) -> Enqueue:
        """Triton's checks of a sequence request (core ``Sequencer::SetupSequenceRequest`` and the batcher)."""
        request = msg.request
        if request.correlation_id in (0, ""):
            if not self._policy.iterative:
                raise TritonError.invalid_arg(
                    f"inference request to model '{self._model}' must specify a non-zero or non-empty correlation ID")
            request = request._replace(correlation_id=self._next_id, flags=SEQUENCE_START)
            self._next_id += 1
            msg = Enqueue(request, msg.batch_size, msg.reply, msg.start_ns)
        if self._policy.max_batch_size > 0 and msg.batch_size != 1:
            raise TritonError.invalid_arg(
                f"inference request to model '{self._model}' must specify batch-size 1 due to requirements of "
                "sequence batcher")
        return msg

    def _dispatch(self) -> None:
        """Run every batch that can run now, then arm the timer for the policy's next deadline.

        Passes over the idle instances until one pass starts nothing: a batch whose requests were all
        cancelled, or that failed before it ran, leaves its instance idle and frees slots that backlog
        sequences take at once, so there may be runnable work again on any idle instance."""
        now = self._clock()
        for corr_id in self._slots.expire(now):
            self._states.pop(corr_id, None)
            log.debug("sequence %s of model '%s' idle: slot released", corr_id, self._model)
        wait: int | None = None
        moved = True
        while moved:
            moved = False
            for inst in self._pool.idle[::-1]:  # the next one to take first
                if self._inline_runs >= self._per_turn and self._turn_spent(now):
                    break  # the rest in the next hub turn (the timer is armed with no delay)
                batch, until = self._slots.take(self._index[inst], now)
                if batch:
                    self._run(inst, batch)
                    moved = True  # requests left the queue, whether they ran or not
                elif until is not None:
                    wait = until if wait is None else min(wait, until)
            # rate-limited instances run only holding their resources: ask for them where a batch can form
            if not moved and self._pool.limited and self._pool.demand_each(self._has_work):
                moved = True
        idle = self._slots.next_idle_ns(now)
        if idle is not None:
            wait = idle if wait is None else min(wait, idle)
        if wait is not None:
            self._timer.arm(now, wait)
        self._maybe_drained()

    def _has_work(self, instance: ModelInstance) -> bool:
        return self._slots.ready(self._index[instance])

    def _run(self, instance: ModelInstance, batch: list[Slot[Enqueue]]) -> None:
        """Start ``batch`` on idle ``instance``; it stays idle when nothing of the batch is left to run
        (its requests were cancelled, or preparing them failed and they were answered)."""
        if any(s.item is not None and s.item.reply.ready() for s in batch):
            batch = self._drop_cancelled(batch)
        if not self._pad:
            batch = [s for s in batch if s.item is not None]
        if not batch:
            return
        template = next(s.item.request for s in batch if s.item is not None)  # a batch ends with a real request
        try:
            watch = instance.watches_cancellation
            requests = [self._prepared(s, watch) if s.item is not None else self._null(template) for s in batch]
        except Exception as e:  # a bug of ours or a state that no longer fits: fail this batch, keep serving
            log.exception("sequence scheduler %s: preparing a batch failed", self.name)
            now = self._clock()
            for slot in batch:
                if slot.item is not None:
                    self._answer(slot, TritonError.internal(f"sequence batcher of '{self._model}': {e!r}"), now, now, (0, 0, 0))
            return
        self._pool.take(instance)
        dispatch_ns = self._clock()
        self._running += sum(1 for slot in batch if slot.item is not None)
        tell = self.ref.tell
        self._count_inline(instance)

        def done(ok: bool, value: Any) -> None:
            try:
                tell(_SeqBatchDone(instance, batch, dispatch_ns, ok, value))
            except TritonError:  # stopped meanwhile: still answer the requests that ran
                self._answer_stopped(batch, ok, value)

        instance.execute(requests, done)

    def _drop_cancelled(self, batch: list[Slot[Enqueue]]) -> list[Slot[Enqueue]]:
        """Requests answered before they ran were cancelled by their clients: they do not run, and the rest of
        their sequence is cancelled with them (Triton: cancelling one request cancels the sequence's pending ones)."""
        now = self._clock()
        out: list[Slot[Enqueue]] = []
        for slot in batch:
            if slot.item is None or not slot.item.reply.ready():
                out.append(slot)
                continue
            self._stats.record_failure(now - slot.item.start_ns)
            self._states.pop(slot.corr_id, None)
            for item in self._slots.cancel(slot.corr_id):
                self._stats.record_failure(now - item.start_ns)
                item.reply.fail(TritonError(Code.CANCELLED, f"sequence {slot.corr_id} was cancelled"))
            out.append(Slot(None, 0))
        while out and out[-1].item is None:
            out.pop()  # a direct batch ends at its highest slot in use
        return out

    def _prepared(self, slot: Slot[Enqueue], watch: bool = False) -> InferRequest:
        assert slot.item is not None
        request, tensors = slot.item.request, self._tensors
        inputs = dict(request.inputs)
        inputs.update(tensors.controls_for(slot.corr_id, slot.flags, True))
        if tensors.states:
            inputs.update(tensors.state_inputs(None if slot.flags & SEQUENCE_START else self._states.get(slot.corr_id)))
        reply = slot.item.reply  # answered before it ran: cancelled; a model in its own process is told
        return request._replace(inputs=inputs, correlation_id=slot.corr_id, flags=slot.flags,
                                is_cancelled=CancelWatch(reply) if watch else reply.ready)

    def _null(self, template: InferRequest) -> InferRequest:
        """Triton's null request for an empty slot of a ``direct`` batch: zeros shaped like a real request,
        READY false, no id (what a python model sees in real Triton 2.51, garbage data aside)."""
        inputs = {n: InferInput(n, t.dtype, t.shape, np.zeros_like(t.data)) for n, t in template.inputs.items()}
        empty_id: int | str = "" if isinstance(template.correlation_id, str) else 0
        inputs.update(self._tensors.controls_for(empty_id, 0, False))
        if self._tensors.states:
            inputs.update(self._tensors.state_inputs(None))
        return InferRequest(template.model_name, template.model_version, "", inputs, None, {},
                            correlation_id=empty_id)

    # -- answers ----------------------------------------------------------------------------------
    def _answer_batch(self, msg: _SeqBatchDone) -> None:
        now = self._clock()
        real = [s for s in msg.batch if s.item is not None]
        if msg.ok:
            results, timings = msg.value
            self._stats.record_execution(len(real), *timings)
        else:
            self._stats.record_execution(len(real), 0, 0, 0)
            error = msg.value if isinstance(msg.value, TritonError) else TritonError.internal(
                f"instance '{msg.instance.name}' failed: {msg.value!r}")
            results, timings = [error] * len(msg.batch), (0, 0, 0)
        for slot, result in zip(msg.batch, results, strict=True):
            if slot.item is not None:
                self._answer(slot, result, now, msg.dispatch_ns, timings)

    def _answer(self, slot: Slot[Enqueue], result: Any, now: int, dispatch_ns: int, timings: Any) -> None:
        item, corr_id, stats = slot.item, slot.corr_id, self._stats
        assert item is not None
        if result is RESCHEDULE:
            channel = item.request.responses
            if not item.reply.ready() and not (channel is not None and channel.cancelled):
                # outside iterative sequences a rescheduled END request still ends its sequence when it runs
                self._slots.requeue(item, corr_id, now, 0 if self._policy.iterative else slot.flags & SEQUENCE_END)
                self._slots.completed(corr_id, now, release=False)
                return
            # its client went away: a model that ignores is_cancelled() must not loop forever
            result = TritonError(Code.CANCELLED, f"sequence {corr_id} was cancelled")
        if item.reply.ready():  # answered already: its client cancelled it
            stats.record_failure(now - item.start_ns)
        elif isinstance(result, BaseException):
            stats.record_failure(now - item.start_ns)
            item.reply.fail(result)
        else:
            if isinstance(result, InferResponse) and self._tensors.states:
                result, saved = self._tensors.take_states(result)
                self._states[corr_id] = saved
            stats.record_success(item.batch_size, now - item.start_ns, dispatch_ns - item.start_ns, timings)
            item.reply.set(result)
        if self._slots.completed(corr_id, now, release=self._policy.iterative):
            self._states.pop(corr_id, None)

    def _answer_stopped(self, batch: list[Slot[Enqueue]], ok: bool, value: Any) -> None:
        results = value[0] if ok else [value] * len(batch)
        for slot, result in zip(batch, results, strict=True):
            if slot.item is None or slot.item.reply.ready():
                continue
            if result is RESCHEDULE or isinstance(result, BaseException):
                error = result if isinstance(result, BaseException) else TritonError.unavailable(
                    f"model version '{self.name}' is unloading")
                slot.item.reply.fail(error)
            else:
                slot.item.reply.set(result)

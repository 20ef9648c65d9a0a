"""SchedulerActor: the queue of one model version and the choice of which idle instance runs what.

An :class:`InlineActor`: its handlers never block, so a message is handled on the sender's stack
when the actor is idle (no loop greenlet, no switch). Messages: :class:`Enqueue` (tell, carries its Reply), :class:`BatchDone` (event from an instance),
:class:`GetStats` (ask), :class:`Drain` (ask; answered once nothing is queued or running).
State owned: the request queue, the idle instances, the version's :class:`VersionStats`.
Failure: a backend error fails only the requests of that batch; the instance goes back to idle.

Policy (spec §6.1): without a scheduling block each request runs alone on the next idle instance;
with ``dynamic_batching`` an idle instance takes every queued request that fits ``max_batch_size``
and has the same variable dimensions (Triton's behaviour with ``max_queue_delay_microseconds: 0``).
Requests are never split. No idle instance: requests wait in the queue (backpressure).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..statistics import VersionStats
from .instance import InstanceActor
from .kernel import InlineActor, Reply

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Enqueue:
    request: InferRequest
    batch_size: int
    reply: Reply[InferResponse]
    start_ns: int


@dataclass(frozen=True, slots=True)
class BatchDone:
    instance: InstanceActor
    items: list[Enqueue]
    dispatch_ns: int
    ok: bool
    value: Any  # (results, timings) or the error


@dataclass(frozen=True, slots=True)
class GetStats:
    pass


@dataclass(frozen=True, slots=True)
class Drain:
    reply: Reply[None]


class SchedulerActor(InlineActor):
    """Default / simple dynamic-batching scheduler for one model version."""

    def __init__(self, name: str, instances: list[InstanceActor], stats: VersionStats,
                 max_batch_size: int, batching: bool) -> None:
        super().__init__(name)
        self._queue: collections.deque[Enqueue] = collections.deque()
        self._idle: list[InstanceActor] = list(reversed(instances))
        self._busy = 0
        self._stats = stats
        self._max_batch = max_batch_size if batching and max_batch_size > 0 else 0
        self._drains: list[Reply[None]] = []

    # -- messages ---------------------------------------------------------------------------------
    def on_Enqueue(self, msg: Enqueue) -> None:
        self._queue.append(msg)
        self._dispatch()

    def on_BatchDone(self, msg: BatchDone) -> None:
        now = time.perf_counter_ns()
        stats = self._stats
        if msg.ok:
            results, timings = msg.value
            stats.record_execution(sum(i.batch_size for i in msg.items), *timings)
            for item, result in zip(msg.items, results, strict=True):
                if isinstance(result, BaseException):
                    stats.record_failure(now - item.start_ns)
                    item.reply.fail(result)
                else:
                    stats.record_success(item.batch_size, now - item.start_ns, msg.dispatch_ns - item.start_ns, timings)
                    item.reply.set(result)
        else:
            stats.record_execution(sum(i.batch_size for i in msg.items), 0, 0, 0)
            error = msg.value if isinstance(msg.value, TritonError) else TritonError.internal(
                f"instance '{msg.instance.name}' failed: {msg.value!r}")
            for item in msg.items:
                stats.record_failure(now - item.start_ns)
                item.reply.fail(error)
        self._busy -= 1
        self._idle.append(msg.instance)
        self._dispatch()

    def on_stop(self) -> None:
        """Nobody waits forever: queued requests fail, drains are answered."""
        error = TritonError.unavailable(f"model version '{self.name}' is unloading")
        while self._queue:
            self._queue.popleft().reply.fail(error)
        for reply in self._drains:
            reply.set(None)
        self._drains.clear()

    def on_GetStats(self, _msg: GetStats) -> dict[str, object]:
        return self._stats.snapshot()

    def on_Drain(self, msg: Drain) -> None:
        self._drains.append(msg.reply)
        self._maybe_drained()

    # -- policy -----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        queue, idle = self._queue, self._idle
        while queue and idle:
            instance = idle.pop()
            items = self._next_batch()
            dispatch_ns = time.perf_counter_ns()
            self._busy += 1
            instance.execute([i.request for i in items], self._completion(instance, items, dispatch_ns))
        self._maybe_drained()

    def _completion(self, instance: InstanceActor, items: list[Enqueue], dispatch_ns: int) -> Callable[[bool, Any], None]:
        """The hub-side callback of one batch: turn it into a BatchDone message for this actor."""
        tell = self.ref.tell

        def done(ok: bool, value: Any) -> None:
            try:
                tell(BatchDone(instance, items, dispatch_ns, ok, value))
            except TritonError:  # stopped meanwhile: still answer the requests that ran
                _answer(items, ok, value)

        return done

    def _next_batch(self) -> list[Enqueue]:
        first = self._queue.popleft()
        items = [first]
        if not self._max_batch:
            return items
        total = first.batch_size
        key = _shape_key(first.request)
        queue = self._queue
        while queue:
            nxt = queue[0]
            if total + nxt.batch_size > self._max_batch or _shape_key(nxt.request) != key:
                break
            items.append(queue.popleft())
            total += nxt.batch_size
        return items

    def _maybe_drained(self) -> None:
        if self._drains and not self._queue and self._busy == 0:
            for reply in self._drains:
                reply.set(None)
            self._drains.clear()


def _answer(items: list[Enqueue], ok: bool, value: Any) -> None:
    """Complete the replies of a batch without the (stopped) scheduler."""
    results = value[0] if ok else [value if isinstance(value, BaseException) else TritonError.internal(repr(value))] * len(items)
    for item, result in zip(items, results, strict=True):
        if isinstance(result, BaseException):
            item.reply.fail(result)
        else:
            item.reply.set(result)


def _shape_key(request: InferRequest) -> tuple[Any, ...]:
    """Requests batch together only when every input has the same non-batch shape (and presence)."""
    return tuple((name, t.shape[1:]) for name, t in request.inputs.items())

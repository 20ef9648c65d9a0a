"""A native thread that takes records from the hub and handles them in batches, off the hub.

What it is for: work the hub only has to hand over, never wait for, and that is worth doing in bulk
(OpenTelemetry spans: observability/otel.py records a span as a tuple on the hub, and this thread encodes
the OTLP protobuf from them and posts it). The hub's whole cost is :meth:`BatchThread.put`: a length check
and a ``deque.append`` (atomic under the GIL, so no lock on the way in), plus a wake-up once per batch.

Bounded: at most ``max_queue`` records wait; a record put while the queue is full is dropped and counted
(:attr:`BatchThread.dropped`, in the units ``weigh`` gives: OpenTelemetry counts spans), and the thread logs the count once per batch that follows a drop, so a
sink that cannot keep up costs records, never the hub's memory or time. Batches: the thread wakes every
``delay_s`` seconds, or as soon as ``wake_at`` records wait, and hands ``handle`` everything queued (in
the order it was put). :meth:`flush` (any thread but the hub: it waits) returns once what was put before
it is handled; :meth:`kick` (the hub) asks for that without waiting; :meth:`close` flushes and ends the
thread. An error of ``handle`` is logged and that batch dropped: the thread goes on.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from .threads import NativeCondition, start_native_thread

log = logging.getLogger(__name__)


class BatchThread:
    """Records put by the hub, handled in batches by one native thread (see the module doc)."""

    def __init__(self, name: str, handle: Callable[[list[Any]], None], max_queue: int, wake_at: int,
                 delay_s: float, weigh: Callable[[Any], int] | None = None) -> None:
        """``weigh``: how much a dropped record counts in :attr:`dropped` (1 each without it)."""
        self.name = name
        self._weigh = weigh
        self._handle = handle
        self._max = max(1, max_queue)
        self._wake_at = max(1, min(wake_at, self._max))
        self._delay = max(0.001, delay_s)
        self._queue: collections.deque[Any] = collections.deque()
        self.dropped = 0  # written by the hub only (put); read by the thread for its log line
        self._reported = 0
        self._cond = NativeCondition()
        self._asked = 0  # flushes asked for (kick, flush, close) and the last one the thread served
        self._served = 0
        self._closing = False
        self._stopped = False
        start_native_thread(self._run)

    def put(self, record: Any) -> None:
        """The hub: queue ``record``, or count it dropped when ``max_queue`` records already wait."""
        queue = self._queue
        if len(queue) >= self._max:
            self.dropped += 1 if self._weigh is None else self._weigh(record)
            return
        queue.append(record)
        if len(queue) == self._wake_at:
            self.kick()

    def kick(self) -> int:
        """Ask the thread to handle what is queued now, without waiting (hub: a full batch, a settings change)."""
        with self._cond:
            self._asked += 1
            self._cond.notify_all()
            return self._asked

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Not on the hub (it waits): True once every record put before this call is handled."""
        asked = self.kick()
        with self._cond:
            while self._served < asked and not self._stopped:
                if not self._cond.wait(timeout):
                    return self._served >= asked
            return self._served >= asked or not self._queue

    def close(self, timeout: float | None = 30.0) -> bool:
        """Not on the hub: handle what is queued, then end the thread. Records put after it are dropped."""
        with self._cond:
            self._closing = True
        return self.flush(timeout)

    def _run(self) -> None:
        """The native thread: wait for a kick or the delay, then hand over everything queued."""
        cond = self._cond
        try:
            while True:
                with cond:
                    if self._asked == self._served and not self._closing:
                        cond.wait(self._delay)
                    asked, closing = self._asked, self._closing
                self._drain()
                with cond:
                    self._served = asked
                    if closing:
                        self._max = 0  # what the hub puts from now on is dropped: no thread would take it
                        self._stopped = True
                    cond.notify_all()
                if closing:
                    return
        except BaseException:  # a thread that dies must not leave flush() waiting for ever
            log.exception("%s: the batch thread failed", self.name)
            with cond:
                self._stopped = True
                cond.notify_all()

    def _drain(self) -> None:
        queue = self._queue
        batch = [queue.popleft() for _ in range(len(queue))]  # popleft is atomic: the hub may append meanwhile
        if self.dropped != self._reported:
            log.warning("%s: %d dropped (more than %d waiting); %d in all", self.name,
                        self.dropped - self._reported, self._max, self.dropped)
            self._reported = self.dropped
        if not batch:
            return
        try:
            self._handle(batch)
        except Exception:  # a sink that fails costs that batch, never the thread
            log.exception("%s: handling %d records failed", self.name, len(batch))

"""The server's side of isolated models' custom metrics (``metrics_forwarding.py`` is the model's side):
their families and series live in the registry of the server that runs the model (its
``pb_utils`` :class:`~.triton_python_backend_utils.serving.MetricRegistry`), where that server's ``/metrics``
reads every model's (``host/metrics_snapshot.py``), so an isolated model's series look as an in-process one's,
and a series shared with other models (same family name and labels) adds up with theirs.

:class:`MetricsMirror` (one per model process) creates what the model registers and applies the
updates it sends: on the instance's thread (those with a command's reply) or on the process's
reader thread (those answering a flush); a lock keeps them one at a time. :func:`flush_isolated`,
called by a scrape in its hub greenlet, asks every live model process for what it has not sent yet
and waits (at most :data:`FLUSH_WAIT_S`) until each answered or died: values a scrape shows are
current, and nothing is sent while nobody scrapes. The live processes are listed in their server's
registry (:func:`register`, any thread), so a scrape asks only its own server's. Failure: a process
that does not answer in time is left as it was last flushed (logged); one that died answers at once
(its session ends the flushes it owed).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import gevent.event

from ...runtime.bridge import HubSignal
from ...runtime.threads import native_lock
from . import triton_python_backend_utils as pb_utils
from .metrics_forwarding import ADD, OBSERVE, SET
from .triton_python_backend_utils import serving
from .triton_python_backend_utils.serving import MetricRegistry, ServerHooks

log = logging.getLogger(__name__)
FLUSH_WAIT_S = 2.0


class MetricsMirror:
    """One model process's series, by the ids the server gave them, in ``server``'s registry."""

    def __init__(self, server: ServerHooks | None = None) -> None:
        self.server = server  # None: the process's only server (serving.current())
        self._series: dict[int, Any] = {}
        self._set_seq: dict[int, int] = {}  # a gauge's last applied SET: a later frame on the other pipe wins
        self._ids = itertools.count(1)
        self._lock = native_lock()

    def family(self, name: str, description: str, kind: int) -> None:
        """The model created ``MetricFamily(name, description, kind)``: create it here (or refuse it)."""
        with serving.using(self.server):
            pb_utils.MetricFamily(name, description, kind)

    def series(self, name: str, description: str, kind: int, labels: dict[str, str],
               buckets: list[float] | None) -> int:
        """The model created a series: create it here (or refuse it); its id."""
        with serving.using(self.server):
            metric = pb_utils.MetricFamily(name, description, kind).Metric(labels, buckets)
        with self._lock:
            sid = next(self._ids)
            self._series[sid] = metric
        return sid

    def apply(self, updates: list[tuple[Any, ...]]) -> None:
        with self._lock:
            for update in updates:
                metric = self._series.get(update[0])
                if metric is None:  # not ours: a bug, not the model's
                    log.error("custom metrics: update of unknown series %r", update[0])
                    continue
                kind = update[1]
                if kind == ADD:
                    metric._value += update[2]
                elif kind == SET:
                    if update[3] > self._set_seq.get(update[0], 0):
                        self._set_seq[update[0]] = update[3]
                        metric._value = update[2]
                elif kind == OBSERVE:
                    counts = metric._bucket_counts
                    for i, n in enumerate(update[2]):
                        counts[i] += n
                    metric._sum += update[3]
                    metric._count += update[4]


class Flushable(Protocol):
    def request_flush(self, done: Callable[[], None]) -> None:
        """Any thread, never waits: ask the process for its updates; ``done()`` once applied (or it died)."""


def register(process: Flushable, registry: MetricRegistry) -> None:
    with registry.lock:
        registry.processes[id(process)] = process


def unregister(process: Flushable, registry: MetricRegistry) -> None:
    with registry.lock:
        registry.processes.pop(id(process), None)


def flush_isolated(registry: MetricRegistry, timeout_s: float = FLUSH_WAIT_S) -> None:
    """Hub greenlet (a scrape): the unsent updates of every live model process of ``registry``'s server,
    applied before this returns."""
    if not registry.processes:
        return
    with registry.lock:
        processes = list(registry.processes.values())
    answered = gevent.event.Event()
    signal = HubSignal(answered.set)
    left: list[int | None] = [len(processes)]  # None once the scrape stopped waiting (the signal is closed then)
    count_lock = native_lock()

    def done() -> None:  # a native thread (the process's reader), or here when it is gone
        with count_lock:
            if left[0] is None:
                return
            left[0] -= 1
            if left[0] == 0:
                signal.send()

    for process in processes:
        process.request_flush(done)  # queued for the process's writer: the hub does not wait for a pipe
    try:
        if not answered.wait(timeout_s):
            log.warning("custom metrics: %s isolated model process(es) did not flush within %.0f s", left[0],
                        timeout_s)
    finally:
        with count_lock:
            left[0] = None
            signal.close()


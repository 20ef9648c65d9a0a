"""An isolated model's custom metrics (``pb_utils.MetricFamily`` / ``Metric``), forwarded to the server
from its process, so that ``/metrics`` shows them as it shows an in-process model's (Triton's stub
forwards them to the server likewise).

Runs in the model's process (``isolated_child``), which installs one :class:`MetricsForwarder` as
``pb_utils.metrics._forward``. A new family or series is a call to the server (``metric_family``,
``metric_series``), which creates it in its own registry, refusing what it would refuse in-process
(another model's family of the same name and another kind, say); the series keeps the server's id.
An update changes the local series (so the model's ``value()`` reads it at once) and marks it dirty,
one set operation: nothing crosses the pipes per update. :meth:`MetricsForwarder.collect` turns the
dirty series into updates, sent with the reply of each command (free: the frame goes anyway) and on
the server's ``("flush_metrics", token)`` before a scrape. Updates are changes, not values (a counter's
or a histogram's increase since the last flush, a gauge's too unless it was ``set``, then its value
with a sequence number), so that several processes sharing one series add up as in-process threads do.

Threads: the model's threads update; the main thread (end of a command) and the reader thread (a
scrape) collect, one at a time (a lock); an update racing a collect marks the series dirty again
after it was taken, so it goes with the next one. Failure: a refused registration raises into the
model as in-process; a process that dies loses what it had not flushed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

ADD, SET, OBSERVE = 0, 1, 2  # update kinds: (id, ADD, delta), (id, SET, value, seq), (id, OBSERVE, counts, sum, n)
HISTOGRAM = 2


class MetricsForwarder:
    """The model process's side of its custom metrics; ``call(op, *args)`` asks the server."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call
        self._dirty: set[Any] = set()
        self._set: set[Any] = set()  # gauges set since their last flush
        self._sent: dict[int, Any] = {}  # series id → what the server has of it (value, or counts/sum/n)
        self._collect = threading.Lock()
        self._seq = itertools.count(1)

    # -- pb_utils.metrics hooks (the model's threads) ------------------------------------------------
    def family(self, name: str, description: str, kind: int) -> None:
        self._call("metric_family", name, description, kind)

    def series(self, metric: Any) -> None:
        family = metric._family
        metric._forward_id = self._call("metric_series", family._name, family._description, family._kind,
                                        metric._labels, metric._buckets)
        if metric._buckets is None:
            self._sent[metric._forward_id] = 0.0
        else:
            self._sent[metric._forward_id] = ([0] * len(metric._bucket_counts), 0.0, 0)

    def changed(self, metric: Any) -> None:
        self._dirty.add(metric)

    def was_set(self, metric: Any) -> None:
        self._set.add(metric)
        self._dirty.add(metric)

    # -- main thread or reader thread ----------------------------------------------------------------
    def collect(self) -> list[tuple[Any, ...]] | None:
        """The updates since the last collect (None when there are none: the usual case, one test)."""
        if not self._dirty:
            return None
        updates = []
        with self._collect:
            dirty = self._dirty
            while dirty:
                try:
                    metric = dirty.pop()
                except KeyError:  # emptied meanwhile
                    break
                update = self._update(metric)
                if update is not None:
                    updates.append(update)
        return updates or None

    def _update(self, metric: Any) -> tuple[Any, ...] | None:
        sid = metric._forward_id
        if metric._family._kind == HISTOGRAM:
            counts, total, n = list(metric._bucket_counts), metric._sum, metric._count
            sent_counts, sent_total, sent_n = self._sent[sid]
            if n == sent_n:
                return None
            self._sent[sid] = (counts, total, n)
            return (sid, OBSERVE, [a - b for a, b in zip(counts, sent_counts, strict=True)], total - sent_total,
                    n - sent_n)
        value = metric._value
        if metric in self._set:
            self._set.discard(metric)
            self._sent[sid] = value
            return (sid, SET, value, next(self._seq))
        delta = value - self._sent[sid]
        if not delta:
            return None
        self._sent[sid] = value
        return (sid, ADD, delta)

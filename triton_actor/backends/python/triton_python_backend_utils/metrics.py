"""Custom metrics: ``MetricFamily`` and its labelled ``Metric`` series (counter, gauge, histogram).

Owner: the values are kept in memory, in the registry of the server whose model created the family
(``serving.current().metrics.families``, :class:`~.serving.MetricRegistry`: one per server, read by that
server's ``/metrics``); it lists every distinct family (a family created twice with the same name, kind
and description shares its series). A series is
updated by the model that holds it, on its instance thread. Failure: bad names, labels, buckets or
values raise ``TypeError``/``ValueError`` that are also ``TritonModelException``; an operation its
kind does not support (``set`` on a counter) raises ``TritonModelException``.

In an isolated model's process (``isolated_child``) :data:`_forward` is set: each new family and series
is registered with the server first (its refusal raises here, as in-process), and each update is noted
for the next flush to the server (``metrics_forwarding.py``); in the server it stays None.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import re
from typing import Any

import numpy as np

from .errors import TritonModelException, _ArgTypeError, _ArgValueError
from .serving import current

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KIND_NAMES = {0: "counter", 1: "gauge", 2: "histogram"}
_forward: Any = None  # an isolated model's process: its MetricsForwarder


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _ArgTypeError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


class Metric:
    """One labelled series of a ``MetricFamily`` (created with ``family.Metric(...)``).

    Exporter view: ``_family``, ``_labels`` (dict), ``_value`` (counter/gauge) and, for
    histograms, ``_buckets`` (upper bounds), ``_bucket_counts`` (per bucket, not
    cumulative; the last entry is +Inf), ``_sum`` and ``_count``.
    """

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._family = family
        self._labels = labels
        self._value = 0.0
        self._buckets = buckets
        self._bucket_counts = [0] * (len(buckets) + 1) if buckets is not None else None
        self._sum = 0.0
        self._count = 0
        self._forward_id = 0  # the server's id of this series (an isolated model's process)

    def _kind(self) -> int:
        return self._family._kind

    def increment(self, value: float) -> None:
        """Add ``value`` (counters: must be >= 0; not for histograms)."""
        amount = _number(value, "increment value")
        kind = self._kind()
        if kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment() is not supported for histogram metrics")
        if kind == MetricFamily.COUNTER and amount < 0:
            raise _ArgValueError("a counter can only be incremented by a non-negative value")
        self._value += amount
        if _forward is not None:
            _forward.changed(self)

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        amount = _number(value, "set value")
        if self._kind() != MetricFamily.GAUGE:
            raise TritonModelException(
                f"set() is not supported for {_KIND_NAMES[self._kind()]} metrics"
            )
        self._value = amount
        if _forward is not None:
            _forward.was_set(self)

    def observe(self, value: float) -> None:
        """Record one observation in a histogram."""
        amount = _number(value, "observed value")
        if self._kind() != MetricFamily.HISTOGRAM:
            raise TritonModelException(
                f"observe() is not supported for {_KIND_NAMES[self._kind()]} metrics"
            )
        assert self._buckets is not None and self._bucket_counts is not None
        self._bucket_counts[bisect.bisect_left(self._buckets, amount)] += 1
        self._sum += amount
        self._count += 1
        if _forward is not None:
            _forward.changed(self)

    def value(self) -> float:
        """Return the current value of a counter or gauge."""
        if self._kind() == MetricFamily.HISTOGRAM:
            raise TritonModelException("value() is not supported for histogram metrics")
        return self._value

    def __repr__(self) -> str:
        return f"Metric({self._family._name!r}, labels={self._labels})"


class MetricKind(enum.IntEnum):
    """Metric kinds; also reachable as ``MetricFamily.COUNTER`` (current) and ``pb_utils.COUNTER`` (old examples)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM


class MetricFamily:
    """A named custom metric family of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise _ArgTypeError("MetricFamily name and description must be str")
        if not _METRIC_NAME.match(name):
            raise _ArgValueError(f"invalid metric family name '{name}'")
        if isinstance(kind, bool) or kind not in _KIND_NAMES:
            raise _ArgValueError(f"unknown metric kind {kind!r}")
        if _forward is not None:  # the server's registry decides first (another model's family counts)
            _forward.family(name, description, int(kind))
        self._name = name
        self._description = description
        self._kind = int(kind)
        self._metrics: dict[tuple[tuple[str, str], ...], Metric] = {}
        families = current().metrics.families
        for family in families:
            if family._name != name:
                continue
            if family._kind != self._kind or family._description != description:
                raise TritonModelException(
                    f"metric family '{name}' already exists with a different "
                    "description or kind"
                )
            self._metrics = family._metrics  # same family: share its series
            return
        families.append(self)

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """Return the series for ``labels`` (histograms need ascending ``buckets``)."""
        labels = dict(labels) if labels else {}
        for key, val in labels.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise _ArgTypeError("metric labels must map str to str")
            if not _LABEL_NAME.match(key):
                raise _ArgValueError(f"invalid metric label name '{key}'")
        bounds: list[float] | None = None
        if self._kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise _ArgValueError("a histogram metric needs buckets")
            bounds = [_number(b, "bucket boundary") for b in buckets]
            if any(b >= c for b, c in itertools.pairwise(bounds)):
                raise _ArgValueError("histogram buckets must be strictly increasing")
        elif buckets is not None:
            raise _ArgValueError(
                f"buckets are only valid for histogram metrics, not {_KIND_NAMES[self._kind]}"
            )
        key = tuple(sorted(labels.items()))
        existing = self._metrics.get(key)
        if existing is not None:
            if existing._buckets != bounds:
                raise TritonModelException(
                    f"metric {labels} of family '{self._name}' already exists with "
                    "different buckets"
                )
            return existing
        metric = Metric(self, labels, bounds)
        if _forward is not None:
            _forward.series(metric)
        self._metrics[key] = metric
        return metric

    def __repr__(self) -> str:
        return f"MetricFamily({self._name!r}, kind={_KIND_NAMES[self._kind]})"


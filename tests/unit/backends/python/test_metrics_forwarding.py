"""Custom metrics of an isolated model: the process's MetricsForwarder batches changes, the server's
MetricsMirror applies them (no pipes: the forwarder's calls go straight to a mirror; the mirror's
series get a suffix so that both sides, here in one process, keep series of their own)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from triton_actor.backends.python.metrics_forwarding import ADD, SET, MetricsForwarder
from triton_actor.backends.python.metrics_mirror import MetricsMirror
from triton_actor.backends.python.triton_python_backend_utils import metrics as pb_metrics
from triton_actor.backends.python.triton_python_backend_utils import serving

_names = itertools.count()


def _pair() -> tuple[MetricsForwarder, MetricsMirror]:
    mirror = MetricsMirror()

    def call(op: str, name: str, *args: Any) -> Any:  # the server's side: no forwarder there
        forward, pb_metrics._forward = pb_metrics._forward, None
        try:
            return getattr(mirror, op.removeprefix("metric_"))(name + "_srv", *args)
        finally:
            pb_metrics._forward = forward

    return MetricsForwarder(call), mirror


def _series(forwarder: MetricsForwarder, kind: int, **kw: Any) -> tuple[Any, Any]:
    """A child-side series registered through ``forwarder``, and the server's series it mirrors."""
    name = f"fwd_test_{next(_names)}"
    pb_metrics._forward = forwarder
    try:
        metric = pb_metrics.MetricFamily(name, "d", kind).Metric(**kw)
    finally:
        pb_metrics._forward = None
    server = pb_metrics.MetricFamily(name + "_srv", "d", kind).Metric(**kw)
    return metric, server


def _updating(forwarder: MetricsForwarder, fn: Any) -> None:
    pb_metrics._forward = forwarder
    try:
        fn()
    finally:
        pb_metrics._forward = None


def test_nothing_changed_collects_nothing() -> None:
    forwarder, _ = _pair()
    assert forwarder.collect() is None
    _series(forwarder, pb_metrics.MetricFamily.COUNTER)
    assert forwarder.collect() is None


def test_changes_cross_as_deltas_and_add_up() -> None:
    forwarder, mirror = _pair()
    counter, server = _series(forwarder, pb_metrics.MetricFamily.COUNTER, labels={"a": "b"})
    _updating(forwarder, lambda: [counter.increment(2) for _ in range(3)])
    updates = forwarder.collect()
    assert updates == [(counter._forward_id, ADD, 6.0)]  # three increments, one update
    mirror.apply(updates)
    _updating(forwarder, lambda: counter.increment(1))
    mirror.apply(forwarder.collect())
    assert server.value() == 7.0 and counter.value() == 7.0
    server.increment(10)  # another process (or an in-process model) shares the series: both count
    _updating(forwarder, lambda: counter.increment(1))
    mirror.apply(forwarder.collect())
    assert server.value() == 18.0


def test_a_gauge_set_sends_its_value_and_the_later_set_wins() -> None:
    forwarder, mirror = _pair()
    gauge, server = _series(forwarder, pb_metrics.MetricFamily.GAUGE)
    _updating(forwarder, lambda: (gauge.set(5), gauge.increment(1)))
    first = forwarder.collect()
    assert first is not None and first[0][1] == SET and first[0][2] == 6.0
    _updating(forwarder, lambda: gauge.set(9))
    second = forwarder.collect()
    mirror.apply(second)
    mirror.apply(first)  # arrived later on the other pipe: older, ignored
    assert server.value() == 9.0
    _updating(forwarder, lambda: gauge.increment(-2))
    mirror.apply(forwarder.collect())
    assert server.value() == 7.0


def test_histograms_cross_as_bucket_deltas() -> None:
    forwarder, mirror = _pair()
    hist, server = _series(forwarder, pb_metrics.MetricFamily.HISTOGRAM, buckets=[1.0, 10.0])
    _updating(forwarder, lambda: [hist.observe(v) for v in (0.5, 5, 50)])
    mirror.apply(forwarder.collect())
    _updating(forwarder, lambda: hist.observe(2))
    mirror.apply(forwarder.collect())
    assert server._bucket_counts == [1, 2, 1] and server._count == 4 and server._sum == 57.5


def test_the_server_refuses_what_it_refuses_in_process() -> None:
    forwarder, _ = _pair()
    name = f"fwd_test_{next(_names)}"
    pb_metrics.MetricFamily(name + "_srv", "d", pb_metrics.MetricFamily.GAUGE)  # another model's, on the server
    pb_metrics._forward = forwarder
    try:
        with pytest.raises(pb_metrics.TritonModelException, match="already exists"):
            pb_metrics.MetricFamily(name, "d", pb_metrics.MetricFamily.COUNTER)
    finally:
        pb_metrics._forward = None
    assert all(f._name != name for f in serving.current().metrics.families)  # not created in the process either

"""OpenTelemetry mode's pure parts: the ``opentelemetry,KEY=VALUE`` settings and sampling with a propagated
context (Triton's ``TraceSetting::SampleTrace`` with ``force_sample``). The span tree is checked against a
real server and an OTLP receiver in tests/integration/test_otel_traces.py."""

from __future__ import annotations

from typing import Any

import pytest

from triton_actor.observability.otel import parse_setting
from triton_actor.observability.tracing import Sampler

pytestmark = pytest.mark.timeout(30)


def test_settings_as_triton_reads_them() -> None:
    into: dict[str, Any] = {}
    for s in ("url=http://collector:4318/v1/traces", "resource=service.name=triton", "resource=a=b=c",
              "bsp_max_queue_size=10", "bsp_schedule_delay=50", "bsp_max_export_batch_size=5"):
        parse_setting(s, into)
    assert into == {"url": "http://collector:4318/v1/traces", "resource": {"service.name": "triton", "a": "b=c"},
                    "bsp_max_queue_size": 10, "bsp_schedule_delay": 50, "bsp_max_export_batch_size": 5}
    for bad in ("resource=plain", "bsp_schedule_delay=soon", "headers=x"):
        with pytest.raises(ValueError):
            parse_setting(bad, {})


def _taken(sampler: Sampler, forced: list[bool]) -> list[bool]:
    return [sampler.take(force) for force in forced]


def test_a_propagated_context_is_traced_whatever_rate_and_count_say() -> None:
    sampler = Sampler({"trace_level": ["TIMESTAMPS"], "trace_rate": ["2"], "trace_count": ["1"]}, otel=True)
    # request 2 uses the count up; after it only forced requests are traced, and they still advance the rate
    assert _taken(sampler, [False, False, True, False, False, True]) == [False, True, True, False, False, True]
    assert sampler.remaining == 0 and sampler.active  # OpenTelemetry mode stays on for forced traces


def test_rate_zero_traces_only_propagated_contexts() -> None:
    sampler = Sampler({"trace_level": ["TIMESTAMPS"], "trace_rate": ["0"]}, otel=True)
    assert _taken(sampler, [False, True, False]) == [False, True, False]
    assert sampler.seen == 0  # Triton does not count requests with rate 0


def test_file_mode_unchanged_by_the_forced_path() -> None:
    sampler = Sampler({"trace_level": ["TIMESTAMPS"], "trace_rate": ["3"], "trace_count": ["2"], "trace_file": ["f"]})
    assert _taken(sampler, [False] * 9) == [False, False, True, False, False, True, False, False, False]
    assert not sampler.active

"""``--metrics-config`` switches (Triton's names), parsed once at start-up into a frozen value.

Triton accepts ``--metrics-config <key>=<value>`` repeatedly; we know ``counter_latencies`` (the
``*_duration_us`` counters, on by default), ``summary_latencies`` (the ``*_summary_us`` summaries),
``histogram_latencies`` (``nv_inference_first_response_histogram_ms``), both off by default, and
``summary_quantiles`` (``q:error,...``; the error is accepted and unused: quantiles are exact over the window). Unknown keys are an error,
as they are for tritonserver.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001))


def _bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"--metrics-config {key}: expected true or false, got {value!r}")


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    out = []
    for part in value.split(","):
        q, _, err = part.partition(":")
        try:
            out.append((float(q), float(err or 0)))
        except ValueError:
            raise ValueError(f"--metrics-config summary_quantiles: bad entry {part!r} (want q:error)") from None
    return tuple(out)


def parse_metrics_config(items: Iterable[str]) -> MetricsConfig:
    """``["summary_latencies=true", ...]`` → :class:`MetricsConfig`; raises ``ValueError`` on a bad item."""
    values: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--metrics-config {item!r}: expected <setting>=<value>")
        if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            values[key] = _bool(key, value)
        elif key == "summary_quantiles":
            values[key] = _quantiles(value)
        else:
            raise ValueError(f"--metrics-config: unknown setting {key!r}")
    return MetricsConfig(**values)  # type: ignore[arg-type]

"""The settings clients may change at run time: logging and trace (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_logging.md, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_trace.md).

One owner for both front ends. Every method runs in a hub greenlet and completes without switching,
so updates are atomic. Log settings act on the process's log handler (``observability/log_format.py``: levels, line
format, per-severity switches), seeded from the command line; every trace settings change is
pushed into the server's :class:`~.tracing.Tracer`, which records the traces (``observability/tracing.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import TritonError
from . import log_format
from .otel import parse_setting

if TYPE_CHECKING:
    from .tracing import Tracer

_LOG_BOOLS = ("log_info", "log_warning", "log_error")
_TRACE_DEFAULTS: dict[str, list[str]] = {"trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
                                         "log_frequency": ["0"], "trace_file": [""], "trace_mode": ["triton"]}


class RuntimeSettings:
    """Current log settings and global / per-model trace settings."""

    def __init__(self, log_info: bool = True, log_verbose: int = 0, trace: dict[str, list[str]] | None = None,
                 tracer: Tracer | None = None, log: dict[str, Any] | None = None) -> None:
        """``log``: the start settings (``log_format.start_settings``); else defaults with ``log_info`` and
        ``log_verbose``."""
        self.log: dict[str, Any] = {"log_file": "", "log_info": log_info, "log_warning": True, "log_error": True,
                                    "log_verbose_level": log_verbose, "log_format": "default"}
        self.log.update(log or {})
        self.trace: dict[str, list[str]] = {k: list(v) for k, v in _TRACE_DEFAULTS.items()}
        self.model_trace: dict[str, dict[str, list[str]]] = {}
        if tracer is None:  # a settings object of its own (tests); a server passes the one its schedulers use
            from .tracing import Tracer  # here, not at import: the CLI imports this module before gevent is patched

            tracer = Tracer()
        self.tracer = tracer
        if trace:  # --trace-config at start-up (trace_file may be set here, and only here)
            self.trace.update({k: list(v) for k, v in trace.items() if k in _TRACE_DEFAULTS})
        if self.trace["trace_mode"] == ["opentelemetry"]:  # the exporter is the start-up mode's, as Triton's
            otel: dict[str, Any] = {}
            for setting in (trace or {}).get(OTEL_KEY, []):
                parse_setting(setting, otel)
            tracer.start_otel(otel)
        tracer.configure(self.trace, self.model_trace)

    # -- logging ----------------------------------------------------------------------------------
    def update_log(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate every change first, then apply them all; returns the full settings."""
        for key, value in changes.items():
            if key in _LOG_BOOLS:
                ok = isinstance(value, bool)
            elif key == "log_verbose_level":
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif key == "log_format":
                ok = value in ("default", "ISO8601")
            elif key == "log_file":
                if value != self.log["log_file"]:  # the handler is the process's from its start
                    raise TritonError.unsupported("log_file cannot be changed at run time")
                ok = True
            else:
                raise TritonError.invalid_arg(f"unknown log setting '{key}'")
            if not ok:
                raise TritonError.invalid_arg(f"invalid value for log setting '{key}': {value!r}")
        self.log.update({k: v for k, v in changes.items() if k != "log_file"})
        log_format.apply(self.log)
        return dict(self.log)

    # -- trace ------------------------------------------------------------------------------------
    def trace_settings(self, model: str = "") -> dict[str, list[str]]:
        """The settings in force; ``trace_count`` is what is left of it, as Triton reports it."""
        current = {**self.trace, **self.model_trace.get(model, {})} if model else dict(self.trace)
        return {**current, "trace_count": [str(self.tracer.remaining(model))]}

    def update_trace(self, changes: dict[str, list[str]], model: str = "") -> dict[str, list[str]]:
        """An empty value list clears the setting (a model falls back to the global value)."""
        for key, values in changes.items():
            if key not in _TRACE_DEFAULTS:
                raise TritonError.invalid_arg(f"unknown trace setting '{key}'")
            if key == "trace_file" and values:
                raise TritonError.unsupported("trace_file cannot be changed over the network")
            if key == "trace_level" and any(v not in ("OFF", "TIMESTAMPS", "TENSORS") for v in values):
                raise TritonError.invalid_arg(f"invalid trace_level {values}")
        target = self.model_trace.setdefault(model, {}) if model else self.trace
        for key, values in changes.items():
            if values:
                target[key] = list(values)
            elif model:
                target.pop(key, None)
            else:
                target[key] = list(_TRACE_DEFAULTS[key])
        self.tracer.configure(self.trace, self.model_trace)
        return self.trace_settings(model)


OTEL_KEY = "opentelemetry"  # start-up only: the exporter's settings, never shown by the trace settings API
_CONFIG_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "mode": "trace_mode",
                "file": "trace_file", "log-frequency": "log_frequency"}


def trace_config(values: list[str], deprecated: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """``--trace-config [mode,]key=value`` flags (and the deprecated ``--trace-level`` etc., given as
    setting name → values) → start-up trace settings. ``level`` may repeat; ``opentelemetry,KEY=VALUE``
    settings (observability/otel.py) are kept under :data:`OTEL_KEY`. Raises ValueError with the flag's problem."""
    out: dict[str, list[str]] = {k: list(v) for k, v in (deprecated or {}).items() if v}
    for value in values:
        mode, _, setting = value.rpartition(",")
        key, sep, val = setting.partition("=")
        if not sep or mode not in ("", "triton", "opentelemetry"):
            raise ValueError(f"invalid --trace-config '{value}': expected [mode,]key=value")
        if mode == "opentelemetry":
            try:
                parse_setting(setting, {})
            except ValueError as e:
                raise ValueError(f"invalid --trace-config '{value}': {e}") from None
            out.setdefault(OTEL_KEY, []).append(setting)
            continue
        name = _CONFIG_KEYS.get(key)
        if name is None:
            raise ValueError(f"invalid --trace-config '{value}': unknown setting '{key}'")
        if name == "trace_level":
            if val not in ("OFF", "TIMESTAMPS", "TENSORS"):
                raise ValueError(f"invalid --trace-config '{value}': level must be OFF, TIMESTAMPS or TENSORS")
            levels = [v for v in out.get(name, []) if v != "OFF"]
            out[name] = [*levels, val] if val != "OFF" else ["OFF"]
        else:
            if name in ("trace_rate", "trace_count", "log_frequency") and not val.lstrip("-").isdigit():
                raise ValueError(f"invalid --trace-config '{value}': '{val}' is not an integer")
            out[name] = [val]
    return out

"""StatsD push: the same totals as ``/metrics``, sent every ``--statsd-interval-ms`` with the ``statsd`` client.

Names (Graphite's dotted style; model names sanitised to ``[A-Za-z0-9_-]``, everything else becomes ``_``),
under ``--statsd-prefix`` (``triton``)::

    <prefix>.model.<model>.<version>.request_success            counter (increments since the last push)
    <prefix>.model.<model>.<version>.request_failure.<REASON>   counter (REJECTED, CANCELED, BACKEND, OTHER)
    <prefix>.model.<model>.<version>.inference_count            counter
    <prefix>.model.<model>.<version>.exec_count                 counter
    <prefix>.model.<model>.<version>.pending_request_count      gauge (sent as +/- changes, see below)
    <prefix>.model.<model>.<version>.load_duration_secs         gauge
    <prefix>.model.<model>.<version>.<stage>_duration_ms        timer: mean per request over the interval
                                    (stage: request, queue, compute_input, compute_infer, compute_output)
    <prefix>.cpu_utilization, cpu_memory_total_bytes, cpu_memory_used_bytes   gauges

With ``--statsd-tags`` the model, version and failure reason are Graphite tags instead of path components
(``<prefix>.request_success;model=<model>;version=<version>``, ``<prefix>.request_failure;model=..;reason=..``;
npm statsd and carbon >= 1.1 pass them through to Graphite's tagged series).

Several workers: every worker pushes what changed in its own process since its last push -- counters as
increments and the pending count as a gauge change (``+n`` / ``-n``) -- and StatsD adds them up, so the
daemon holds the host's totals without any cross-process call, and a worker that is replaced takes only
its own (already pushed) share with it. Its last push, at shutdown after the drain, brings its pending
share back to 0. The load time and the host gauges (CPU, memory) are plain gauges: every worker sends about
the same value. (Trap: without ``deleteIdleStats``, a server killed with requests pending leaves its share
in the daemon's pending gauge until the daemon restarts.) Owner: the server of each process; the previous
values (for the changes) are the pusher's own. Failure: StatsD is UDP, fire and forget; an error building
or sending one push is logged and the next push sends the changes since the last successful one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import gevent
import statsd

from .families import merge_models

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_UNSAFE_TAG = re.compile(r"[^A-Za-z0-9_.-]")  # what survives npm statsd's key sanitising in a tag value
_STAGES = ("request", "queue", "compute_input", "compute_infer", "compute_output")


def sanitise(name: str) -> str:
    """A model name as one Graphite path component (dots would split it)."""
    return _UNSAFE.sub("_", name) or "_"


class StatsdPusher:
    """Every ``interval_s``: snapshot this process, diff with the last push, send counters, timers and gauges."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], host: str, port: int = 8125,
                 prefix: str = "triton", interval_s: float = 1.0,
                 system: Callable[[], dict[str, list[tuple[dict[str, str], float]]]] | None = None,
                 tags: bool = False) -> None:
        self.snapshot = snapshot  # this process's metrics snapshot (snapshot.MetricsSource)
        self.client = statsd.StatsClient(host, port, prefix=prefix or None)
        self.interval_s = interval_s
        self.system = system
        self.tags = tags
        self._last: dict[tuple[str, str], dict[str, Any]] = {}
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._loop)

    def stop(self, flush: bool = True) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
        if flush:
            self.push_once()

    def _loop(self) -> None:
        while True:
            gevent.sleep(self.interval_s)  # the push period itself, not a synchronisation
            self.push_once()

    def push_once(self) -> None:
        try:
            models = merge_models([self.snapshot()])
            with self.client.pipeline() as pipe:
                for entry in models:
                    self._push_model(pipe, entry)
                self._push_system(pipe)
        except Exception:  # one lost push; the next sends the deltas since the last one
            log.exception("statsd push failed")

    def _push_model(self, pipe: Any, e: dict[str, Any]) -> None:
        key = (e["model"], e["version"])
        name = self._namer(e["model"], e["version"])
        last = self._last.get(key)
        self._last[key] = e
        prev = last or {"success": 0, "inference_count": 0, "exec_count": 0, "failures": {}, "pending": 0,
                        "durations_us": dict.fromkeys(_STAGES, 0)}
        for field in ("success", "inference_count", "exec_count"):
            delta = e[field] - prev[field]
            if delta > 0 or last is None:
                pipe.incr(name("request_success" if field == "success" else field), delta)
        for reason, n in e["failures"].items():
            delta = n - prev["failures"].get(reason, 0)
            if delta > 0 or last is None:
                pipe.incr(name("request_failure", reason), delta)
        requests = e["success"] - prev["success"]
        if requests > 0:
            for stage in _STAGES:
                mean_us = (e["durations_us"][stage] - prev["durations_us"][stage]) / requests
                pipe.timing(name(f"{stage}_duration_ms"), mean_us / 1000.0)
        # a change, not a value: the workers' shares add up (+0 keeps an idle gauge alive in the daemon)
        pipe.gauge(name("pending_request_count"), e["pending"] - prev["pending"], delta=True)
        pipe.gauge(name("load_duration_secs"), e["load_secs"])

    def _namer(self, model: str, version: str) -> Callable[..., str]:
        """``name(metric, reason=None)`` for one version: dotted path components, or Graphite tags."""
        if self.tags:
            tags = f";model={_UNSAFE_TAG.sub('_', model)};version={_UNSAFE_TAG.sub('_', version)}"
            return lambda metric, reason=None: metric + tags + (f";reason={reason}" if reason else "")
        base = f"model.{sanitise(model)}.{sanitise(version)}"
        return lambda metric, reason=None: f"{base}.{metric}" + (f".{reason}" if reason else "")

    def _push_system(self, pipe: Any) -> None:
        if self.system is None:
            return
        for name, series in self.system().items():
            for labels, value in series:
                suffix = f".{sanitise(labels['gpu_uuid'])}" if "gpu_uuid" in labels else ""
                pipe.gauge(name.removeprefix("nv_") + suffix, value)

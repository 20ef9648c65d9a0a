"""One point: load the candidate (when it is not the one loaded), run the load generator, read the server's
statistics around it. The ``measure`` function the search is given.

Runs in the tuner's main thread; the load generator is a child process (``loadgen.py``) it waits for. A
candidate the server refuses to load is a failed point carrying the server's message (what was serving
keeps serving: load-then-swap), and so is a load generator that dies; the search goes on either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..errors import TritonError
from . import config_writer
from .loadgen import inputs_from_config
from .points import Candidate, Point
from .target import Target

MIN_WINDOWS = 3  # windows that must agree: perf_analyzer's three measurements


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the load generator measures: perf_analyzer's warm-up, window and stability settings."""

    warmup_s: float = 1.0
    window_s: float = 1.0
    min_windows: int = MIN_WINDOWS
    max_windows: int = 8
    stability_pct: float = 10.0

    def worst_case_s(self) -> float:
        return self.warmup_s + self.window_s * self.max_windows


class Measurer:
    """``measurer(candidate, concurrency) -> Point`` against ``target``; ``base`` is the served config
    the candidates are applied to."""

    def __init__(self, target: Target, base: config_writer.ModelConfig, base_json: dict[str, Any], timing: Timing) -> None:
        self.target, self.base, self.timing = target, base, timing
        self.loaded: Candidate | None = config_writer.candidate_of(base)
        self._spec = {"url": target.url, "protocol": target.protocol, "model": target.model,
                      "inputs": inputs_from_config(base_json), "outputs": [o["name"] for o in base_json.get("output", [])],
                      "warmup_s": timing.warmup_s, "window_s": timing.window_s, "min_windows": timing.min_windows,
                      "max_windows": timing.max_windows, "stability_pct": timing.stability_pct}

    def __call__(self, candidate: Candidate, concurrency: int) -> Point:
        if candidate != self.loaded:
            try:
                self.target.load(config_writer.override_json(config_writer.apply(self.base, candidate)))
            except TritonError as e:
                return Point(candidate, concurrency, error=f"load failed: {e.message}")
            self.loaded = candidate
        before, cpu, wall = self.target.statistics(), self.target.cpu_seconds(), time.monotonic()
        result = self._run_loadgen(concurrency)
        after = self.target.statistics()
        if cpu is not None:  # over the whole run of the load generator, its warm-up included
            after["server_cpu_pct"] = ((self.target.cpu_seconds() or cpu) - cpu) / (time.monotonic() - wall) * 100
        if "error_text" in result:
            return Point(candidate, concurrency, error=result["error_text"])
        return _point(candidate, concurrency, result, before, after)

    def _run_loadgen(self, concurrency: int) -> dict[str, Any]:
        spec = json.dumps(dict(self._spec, concurrency=concurrency))
        proc = subprocess.Popen([sys.executable, "-m", "triton_actor.tune.loadgen", spec],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=self.timing.worst_case_s() + 120)
        except BaseException:  # a timeout or Ctrl-C: the load generator must not outlive the point
            proc.kill()
            proc.wait()
            raise
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = " | ".join(err.strip().splitlines()[-3:])
            return {"error_text": f"load generator failed ({proc.returncode}): {tail}"}
        return json.loads(lines[-1])


def _point(candidate: Candidate, concurrency: int, r: dict[str, Any], before: dict[str, float],
           after: dict[str, float]) -> Point:
    delta = {k: max(0.0, after[k] - before[k]) for k in before}
    queue_us = delta["queue_ns"] / delta["count"] / 1000 if delta["count"] else 0.0
    compute_us = delta["compute_ns"] / delta["executions"] / 1000 if delta["executions"] else 0.0
    return Point(candidate, concurrency, throughput=r["throughput"], p50_ms=r["p50_ms"], p95_ms=r["p95_ms"],
                 p99_ms=r["p99_ms"], cv_pct=r["cv_pct"], stable=r["stable"], windows=r["windows"],
                 loadgen_cpu_pct=r["loadgen_cpu_pct"], server_cpu_pct=after.get("server_cpu_pct", 0.0), queue_us=queue_us, compute_us=compute_us,
                 errors=r["errors"], error=r["error"])

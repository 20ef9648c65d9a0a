"""One point: load the candidate (when it is not the one loaded), run the load generator, read the server's
statistics around it. The ``measure`` function the search is given; its load level is a concurrency, or
with ``open_loop`` an offered request rate.

A candidate's ``model`` names the ensemble's composing model it is for: that model is loaded and its
statistics read, while the load generator sends to the ensemble. A candidate whose ``workers`` differs
from the server's restarts the server started here with that many (``Target.restart``) and loads the
candidate on it.

Runs in the tuner's main thread; the load generator is one child process (``loadgen.py --serve``) for the
whole run, given a spec per point on its stdin, each answer waited for up to the point's worst case (a
child started per point spent half a second importing its clients every time). A candidate the server
refuses to load is a failed point carrying the server's message (what was serving keeps serving:
load-then-swap), and so is a load generator that dies or overruns (it is started again for the next
point); the search goes on either way.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
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

    warmup_s: float = 0.5
    window_s: float = 0.5
    min_windows: int = MIN_WINDOWS
    max_windows: int = 8
    stability_pct: float = 10.0  # the 95 % confidence interval's half-width, % of the mean (loadgen.settled)

    def worst_case_s(self) -> float:
        return self.warmup_s + self.window_s * self.max_windows


class Measurer:
    """``measurer(candidate, level) -> Point`` against ``target``; ``base`` is the served config the
    candidates are applied to (``bases``: an ensemble's composing models', by name)."""

    def __init__(self, target: Target, base: config_writer.ModelConfig, base_json: dict[str, Any], timing: Timing,
                 *, open_loop: bool = False, bases: dict[str, config_writer.ModelConfig] | None = None) -> None:
        self.target, self.timing, self.open_loop = target, timing, open_loop
        self.bases = bases or {"": base}
        self.shipped = {name: config_writer.candidate_of(cfg, name) for name, cfg in self.bases.items()}
        self.loaded: dict[str, Candidate] = dict(self.shipped)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._spec = {"protocol": target.protocol, "model": target.model,
                      "inputs": inputs_from_config(base_json), "outputs": [o["name"] for o in base_json.get("output", [])],
                      "warmup_s": timing.warmup_s, "window_s": timing.window_s, "min_windows": timing.min_windows,
                      "max_windows": timing.max_windows, "stability_pct": timing.stability_pct}

    def __call__(self, candidate: Candidate, level: int) -> Point:
        if (candidate.workers or 1) != self.target.workers:
            try:
                self.target.restart(candidate.workers or 1)
            except TritonError as e:
                return self._failed(candidate, level, f"restart with --workers {candidate.workers or 1} failed: {e.message}")
            self.loaded = dict(self.shipped)  # a fresh server serves the repository's configs
        try:
            self.ensure(candidate)
        except TritonError as e:
            return self._failed(candidate, level, f"load failed: {e.message}")
        stats_of = candidate.model
        before, cpu, wall = self.target.statistics(stats_of), self.target.cpu_seconds(), time.monotonic()
        result = self._run_loadgen(level)
        after = self.target.statistics(stats_of)
        if cpu is not None:  # over the whole run of the load generator, its warm-up included
            after["server_cpu_pct"] = ((self.target.cpu_seconds() or cpu) - cpu) / (time.monotonic() - wall) * 100
        if "error_text" in result:
            return self._failed(candidate, level, result["error_text"])
        return _point(candidate, level, result, before, after, self.open_loop)

    def ensure(self, candidate: Candidate) -> None:
        """Load ``candidate`` unless it is what serves (an ensemble's pick, before the next model's search)."""
        if candidate != self.loaded[candidate.model]:
            self.target.load(config_writer.override_json(config_writer.apply(self.bases[candidate.model], candidate)),
                             candidate.model)
            self.loaded[candidate.model] = candidate

    def _failed(self, candidate: Candidate, level: int, error: str) -> Point:
        return Point(candidate, 0 if self.open_loop else level, error=error, request_rate=level if self.open_loop else 0.0)

    def _run_loadgen(self, level: int) -> dict[str, Any]:
        load = {"request_rate": level, "concurrency": 0} if self.open_loop else {"concurrency": level}
        spec = json.dumps(dict(self._spec, url=self.target.url, **load))
        proc = self._loadgen()
        try:
            assert proc.stdin is not None
            proc.stdin.write(spec.encode() + b"\n")
            proc.stdin.flush()
            line = self._answer(proc, time.monotonic() + self.timing.worst_case_s() + 120)
        except BaseException:  # Ctrl-C: the load generator must not outlive the point
            self.close(kill=True)
            raise
        if line is None:  # it died, or overran the point: the next point starts a fresh one
            self.close(kill=True)
            return {"error_text": f"load generator failed ({proc.returncode}): {self._stderr_tail()}"}
        return json.loads(line)

    def _loadgen(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._stderr = tempfile.TemporaryFile()  # a file: nobody has to drain it while a point runs
            self._proc = subprocess.Popen([sys.executable, "-m", "triton_actor.tune.loadgen", "--serve"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                          bufsize=0, start_new_session=True)
            self._buffer = b""
        return self._proc

    def _answer(self, proc: subprocess.Popen[bytes], deadline: float) -> str | None:
        """The next line the load generator writes; None when it ends or ``deadline`` passes first."""
        assert proc.stdout is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return " | ".join(self._stderr.read().decode(errors="replace").strip().splitlines()[-3:])

    def close(self, kill: bool = False) -> None:
        """Stop the load generator: at the end of the run (its loop ends at end of file), or ``kill`` it
        (Ctrl-C, or one that overran a point)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(0 if kill else 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _point(candidate: Candidate, level: int, r: dict[str, Any], before: dict[str, float],
           after: dict[str, float], open_loop: bool = False) -> Point:
    delta = {k: max(0.0, after[k] - before[k]) for k in before}
    queue_us = delta["queue_ns"] / delta["count"] / 1000 if delta["count"] else 0.0
    compute_us = delta["compute_ns"] / delta["executions"] / 1000 if delta["executions"] else 0.0
    return Point(candidate, 0 if open_loop else level, request_rate=level if open_loop else 0.0, throughput=r["throughput"], p50_ms=r["p50_ms"], p95_ms=r["p95_ms"],
                 p99_ms=r["p99_ms"], cv_pct=r["cv_pct"], stable=r["stable"], windows=r["windows"],
                 loadgen_cpu_pct=r["loadgen_cpu_pct"], server_cpu_pct=after.get("server_cpu_pct", 0.0), queue_us=queue_us, compute_us=compute_us,
                 errors=r["errors"], error=r["error"])

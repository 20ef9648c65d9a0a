"""The progress bar: points measured of the search's upper bound, the last point, and an ETA (the mean
time per point times the points left, never past the ``--max-minutes`` deadline). On a terminal one line
redrawn in place; otherwise (a log, a pipe) one line per point."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .points import Point

WIDTH = 24


class Progress:
    def __init__(self, deadline: float, stream: TextIO | None = None) -> None:
        self.total, self.done, self.deadline = 1, 0, deadline
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._live = self.stream.isatty()

    def eta_s(self, now: float) -> float:
        per_point = (now - self.started) / max(self.done, 1)
        return max(0.0, min(per_point * max(self.total - self.done, 0), self.deadline - now))

    def step(self, point: Point) -> None:
        self.done += 1
        self.total = max(self.total, self.done)
        filled = round(WIDTH * self.done / self.total)
        what = point.error[:60] if point.error else f"{point.throughput:.1f}/s p99 {point.p99_ms:.1f} ms"
        line = (f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} points, "
                f"ETA {_clock(self.eta_s(time.monotonic()))} | {point.candidate.label()} {point.load_label()}: {what}")
        if self._live:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._live and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m}m{s:02d}s"

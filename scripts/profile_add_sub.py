#!/usr/bin/env python3
"""Where one add_sub request's CPU goes: our server under perf_analyzer, profiled, per inference.

Starts the server of a checkout (this one, or ``--root``) on Triton's own ``add_sub``, drives it with
perf_analyzer (``--protocol http|grpc``, ``--concurrency``) and reports per inference (the statistics
endpoint's count over the run):

* the server's CPU (user + system of its process tree from /proc);
* with ``--cprofile FILE``: the server runs under cProfile timed by the hub thread's CPU clock (a busy
  host preempts; wall time would mostly be waiting), and the table gives each function's calls and own
  CPU per inference over the measured run (the profiler is switched on and off by signals around
  it), top ``--top`` by own time. The profiler's own cost inflates every call (about
  1 µs a call here): read counts, and times as shares, not absolutes;
* with ``--py-spy FILE`` (a py-spy binary on PATH or ``--py-spy-bin``): a sampling profile of the server
  while perf_analyzer runs, written as collapsed stacks; the summary gives the share of samples under
  each of ``--group`` (function names, inclusive), which cost the server little to take.

    .venv/bin/python scripts/profile_add_sub.py --protocol http --concurrency 4 --cprofile /tmp/http.prof
    .venv/bin/python scripts/profile_add_sub.py --protocol grpc --py-spy /tmp/grpc.txt --py-spy-bin /tmp/venv/bin/py-spy
    .venv/bin/python scripts/profile_add_sub.py --root /path/to/older/checkout      # CPU per inference only
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http import ROOT, PerfFailed, copy_add_sub, free_port, perf, stop_servers, wait_ready
from bench_pipeline import _RUN
from bench_workers import _TICK, served, tree


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds of ``pids`` (utime, stime from /proc)."""
    user = system = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / _TICK, system / _TICK


# cProfile on the hub thread between SIGUSR1 (on) and SIGUSR2 (off, written out): the start-up and the
# warm-up stay out of the counts. The handlers run in the main thread, which is the hub's.
_PROFILED = """import cProfile, signal, time
prof = cProfile.Profile(time.thread_time)
def _on(*_):
    prof.enable()
def _off(*_):
    prof.disable()
    prof.dump_stats(%r)
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
"""


def start(repo: Path, root: Path, http: int, grpc: int, profile: Path | None) -> subprocess.Popen:
    code = "import runpy, sys\n" + (_PROFILED % str(profile) if profile is not None else "") + _RUN
    args = [sys.executable, "-c", code, "--model-repository", str(repo), "--http-port", str(http),
            "--http-address", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-address", "127.0.0.1",
            "--log-info=false", "--allow-metrics=false"]
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def run_perf(port: int, c: int, window_ms: int, out_csv: Path, protocol: str) -> float:
    """perf_analyzer for three windows; its rate, or NaN when the windows were not stable (the CPU and
    the count over the run are what this script reads: they hold either way)."""
    try:
        return perf(port, c, window_ms, out_csv, protocol, stability=100, max_trials=3)["rps"]
    except PerfFailed:
        return float("nan")


def wait_for_file(path: Path, after: float, timeout: float = 60) -> None:
    """Until the server has written the profile (it does so in its signal handler)."""
    deadline = time.time() + timeout
    while not (path.exists() and path.stat().st_mtime >= after and path.stat().st_size):
        if time.time() > deadline:
            raise SystemExit(f"no profile written to {path}")
        time.sleep(0.2)
    time.sleep(0.5)  # the dump may still be writing


def cprofile_table(path: Path, n: int, top: int) -> None:
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for _, v in rows)
    print(f"cProfile: {total * 1e6 / n:.0f} µs of hub-thread CPU per inference (profiler's cost included)")
    print(f"{'calls/inf':>9} {'own µs/inf':>10} {'cum µs/inf':>10}  function")
    for (file, line, name), (_cc, ncalls, tottime, cumtime, _callers) in rows[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"{ncalls / n:9.2f} {tottime * 1e6 / n:10.2f} {cumtime * 1e6 / n:10.2f}  {name} ({where})")


def py_spy_summary(path: Path, groups: list[str]) -> None:
    samples, under = 0, collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        k = int(count)
        samples += k
        frames = stack.split(";")
        for g in groups:
            if any(f.startswith(g + " ") or f == g for f in frames):
                under[g] += k
    print(f"py-spy: {samples} samples")
    for g in groups:
        print(f"{under[g] * 100 / max(1, samples):6.1f} %  under {g}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server is measured")
    ap.add_argument("--protocol", default="http", choices=("http", "grpc"))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--cprofile", type=Path)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--py-spy", type=Path, dest="py_spy")
    ap.add_argument("--py-spy-bin", default="py-spy")
    ap.add_argument("--group", action="append", default=[], help="py-spy: report the share under this function")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="profile_add_sub_"))
    copy_add_sub(work / "repo")
    ports = {"http": free_port(), "grpc": free_port()}
    proc = start(work / "repo", a.root.resolve(), ports["http"], ports["grpc"], a.cprofile)
    spy = None
    mtime_after = time.time()
    if a.cprofile and a.cprofile.exists():
        a.cprofile.unlink()
    try:
        wait_ready(ports["http"], proc)
        run_perf(ports[a.protocol], a.concurrency, 1000, work / "warm.csv", a.protocol)
        if a.py_spy:
            spy = subprocess.Popen([a.py_spy_bin, "record", "-p", str(proc.pid), "-r", "200", "-f", "raw",
                                    "-o", str(a.py_spy)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if a.cprofile:
            proc.send_signal(signal.SIGUSR1)
        cpu0, n0 = cpu_split(tree(proc.pid)), served(ports["http"])
        rps = run_perf(ports[a.protocol], a.concurrency, a.window_ms, work / "pa.csv", a.protocol)
        n = served(ports["http"]) - n0
        user, system = (b - a for a, b in zip(cpu0, cpu_split(tree(proc.pid)), strict=True))
        cpu_us, user_us = (user + system) * 1e6 / max(1, n), user * 1e6 / max(1, n)
        if a.cprofile:
            proc.send_signal(signal.SIGUSR2)
            wait_for_file(a.cprofile, mtime_after)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        stop_servers([proc], work)
    print(f"{a.root} {a.protocol} c={a.concurrency}: {n} inferences, {rps:.0f} infer/s, "
          f"{cpu_us:.0f} µs server CPU per inference, {user_us:.0f} of it user (load average {os.getloadavg()[0]:.2f})")
    if a.cprofile:
        cprofile_table(a.cprofile, n, a.top)
    if a.py_spy:
        py_spy_summary(a.py_spy, a.group)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tuned configurations of a Python model measured on both servers with perf_analyzer (issue 26's
"Against Model Analyzer": each tool's pick, and the shipped config, on triton_actor and on real Triton 2.51).

Each ``--pick NAME=CONFIG[:WORKERS]`` is a config file (``configs/tuned.pbtxt`` from ``triton-actor tune``,
or the ``config.pbtxt`` of Model Analyzer's best ``<model>_config_N``), served as the model of
``--model-dir`` (default Triton's own ``add_sub``, ``scripts/triton_reference/add_sub``; the batching
comparison used ``scripts/triton_reference/batch_sleep``) with that folder's ``model.py``, under the
folder's name; ``WORKERS`` is our ``--workers`` for it
(Triton has no such flag: one process). For every pick, server and concurrency: one perf_analyzer run
(HTTP), infer/s and p99. The picks run in rounds, one server after the other, so the host's drift hits
them alike; the table has the medians and, per pick, the best throughput within ``--latency-budget-ms``.

    scripts/install_bench_tools.sh          # once: perf_analyzer and real tritonserver
    .venv/bin/python scripts/bench_tune_picks.py --pick shipped=scripts/triton_reference/add_sub/config.pbtxt \\
        --pick tune=/tmp/ours/add_sub/configs/tuned.pbtxt:2 --pick ma=/tmp/ma/best/config.pbtxt \\
        --concurrency 1,4,16 --latency-budget-ms 20

Writes ``bench_out/tune_picks.json`` (every run) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from bench_http import ROOT, PerfFailed, free_port, perf, start_ours, start_triton, stop_servers, wait_ready


def _repo(work: Path, name: str, config: Path, model_dir: Path) -> Path:
    """A repository with ``model_dir``'s model served with ``config`` (its name set to the folder's)."""
    repo, model = work / name, model_dir.name
    shutil.copytree(model_dir, repo / model, ignore=shutil.ignore_patterns("__pycache__", "config.pbtxt", "configs"))
    text = re.sub(r'(?m)^name:\s*"[^"]*"', f'name: "{model}"', config.read_text())
    (repo / model / "config.pbtxt").write_text(text)
    return repo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pick", action="append", required=True, help="NAME=CONFIG[:WORKERS]")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "scripts" / "triton_reference" / "add_sub",
                    help="the model's folder (its model.py is served; its name is the model's)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--latency-budget-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--stability", type=int, default=20)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    picks = []
    for spec in args.pick:
        name, rest = spec.split("=", 1)
        path, _, workers = rest.partition(":")
        picks.append((name, Path(path), int(workers or 1)))
    work = Path(tempfile.mkdtemp(prefix="tune_picks_"))
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        for _ in range(args.rounds):
            for name, config, workers in picks:
                repo = _repo(work, name, config, args.model_dir.resolve())
                for server in ("triton_actor", "triton"):
                    port = free_port()
                    extra = ("--workers", str(workers)) if workers > 1 else ()
                    proc = start_ours(repo, port, *extra) if server == "triton_actor" else start_triton(repo, port)
                    try:
                        wait_ready(port, proc)
                        for c in levels:
                            try:
                                row = perf(port, c, args.window_ms, work / "pa.csv", model=args.model_dir.name,
                                           stability=args.stability)
                            except PerfFailed as e:
                                row = {"rps": 0.0, "p50_us": 0.0, "p99_us": 0.0, "failed": str(e)[-300:]}
                            runs.setdefault((name, server, c), []).append(row)
                            print(f"{name:10} {server:12} c={c:<3} {row['rps']:9.1f}/s p99 {row['p99_us'] / 1000:7.2f} ms",
                                  flush=True)
                    finally:
                        stop_servers([proc], work / "none")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = ROOT / "bench_out"
    out.mkdir(exist_ok=True)
    (out / "tune_picks.json").write_text(json.dumps([{"pick": k[0], "server": k[1], "concurrency": k[2], "runs": v}
                                                     for k, v in runs.items()], indent=2))
    print(f"\n| pick | server | {' | '.join(f'c={c} infer/s (p99 ms)' for c in levels)} | best within {args.latency_budget_ms:g} ms |")
    print("|---|---|" + "---|" * (len(levels) + 1))
    for name, _, workers in picks:
        for server in ("triton_actor", "triton"):
            cells, best = [], 0.0
            for c in levels:
                rps = statistics.median(r["rps"] for r in runs[name, server, c])
                p99 = statistics.median(r["p99_us"] for r in runs[name, server, c]) / 1000
                cells.append(f"{rps:.1f} ({p99:.2f})")
                if rps > 0 and p99 <= args.latency_budget_ms:
                    best = max(best, rps)
            label = f"{name}{f' ({workers} workers)' if workers > 1 and server == 'triton_actor' else ''}"
            print(f"| {label} | {server} | {' | '.join(cells)} | {best:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""What dynamic batching and instance count buy: Triton's perf_analyzer against triton_actor (HTTP), one run.

Models (one server, ``--disable-auto-complete-config`` so a config without ``dynamic_batching`` stays that way):

* ``mlp_nobatch`` / ``mlp_batch``: ONNX MLP 1024→4096→4096→16 (about 80 MB FP32; memory-bound at batch 1), one
  instance each, ``max_batch_size: 16``; ``mlp_batch`` adds ``dynamic_batching { preferred_batch_size: [8, 16]
  max_queue_delay_microseconds: 1000 }`` (``--mlp-delay-us``, ``--mlp-preferred``).
* ``py_count1`` / ``py_count2``: Python identity (FP32 [16]) whose ``execute`` sleeps 5 ms without holding the GIL,
  one and two instances, no batching; ``py_count1_batch`` adds dynamic batching to the single instance.

For every model and concurrency (``--concurrency``, default 1,2,4,8,16) one perf_analyzer run (HTTP, batch 1),
infer/s and p50/p99 latency from its CSV; the server's statistics endpoint read before and after gives the
average executed batch size (``inference_count`` / ``execution_count`` over the run) — the proof that batching,
not something else, made the difference. Before the server starts, the same MLP runs in-process with ONNX
Runtime at batch 1 and 16 with the server's thread settings: the ratio is the ceiling batching can reach.

    scripts/install_bench_tools.sh                              # once: perf_analyzer
    .venv/bin/pip install -e ".[onnx,bench]"                    # onnx, onnxruntime, matplotlib
    .venv/bin/python scripts/bench_batching.py --rounds 2       # full run, about 15 minutes
    .venv/bin/python scripts/bench_batching.py --quick          # c=1,4,16, short windows, about 3 minutes
    .venv/bin/python scripts/bench_batching.py --replot bench_out/batching.json    # plot only

Writes ``bench_out/batching.{md,csv,json}`` and ``docs/bench_batching.png``. The MLP file is generated once
into ``~/.cache/triton_actor_bench/models/`` (keyed by dims and seed) and linked into a temporary repository.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import modelgen  # noqa: E402
from bench_http import TOOLS, PerfFailed, free_port, perf, start_ours, wait_ready  # noqa: E402
from bench_mlp import in_process  # noqa: E402

MLP_DIMS = (1024, 4096, 4096, 16)
SEED = 0
MAX_BATCH = 16
PY_DELAY_MS = 5.0


@dataclass(frozen=True)
class Variant:
    name: str
    family: str  # "mlp" or "python": one plot row each
    label: str
    batching: bool
    count: int


VARIANTS = (
    Variant("mlp_nobatch", "mlp", "ONNX MLP, no batching", False, 1),
    Variant("mlp_batch", "mlp", "ONNX MLP, dynamic batching", True, 1),
    Variant("py_count1", "python", "Python 5 ms, count 1", False, 1),
    Variant("py_count2", "python", "Python 5 ms, count 2", False, 2),
    Variant("py_count1_batch", "python", "Python 5 ms, count 1, dynamic batching", True, 1),
)
# (numerator, denominator, concurrency, goal, goal as text): docs/performance.md#dynamic-batching
RATIOS = (("mlp_batch", "mlp_nobatch", 16, 3.0, "≥ 3x"), ("py_count2", "py_count1", 4, 1.8, "≈ 2x (≥ 1.8x)"))


# --------------------------------------------------------------------------------------------------------------
# models


def cached_mlp(dims: tuple[int, ...], seed: int) -> Path:
    """The MLP's model.onnx, generated once per (dims, seed) into the tools cache."""
    key = f"mlp_{'-'.join(map(str, dims))}_seed{seed}"
    path = TOOLS / "models" / key / "1" / "model.onnx"
    if not path.exists():
        t0 = time.perf_counter()
        modelgen.onnx_mlp(TOOLS / "models", key, dims=dims, config=False, seed=seed)
        print(f"[bench] generated {path} ({path.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.0f} s)",
              flush=True)
    return path


def build_repo(repo: Path, mlp_file: Path, variants: list[Variant], args: argparse.Namespace) -> None:
    for v in variants:
        delay_us = args.mlp_delay_us if v.family == "mlp" else args.py_delay_us
        batching = {"dynamic_batching": v.batching, "max_queue_delay_us": delay_us if v.batching else 0,
                    "preferred_batch_size": args.mlp_preferred if v.batching and v.family == "mlp" else (),
                    "count": v.count}
        if v.family == "mlp":
            model_dir = repo / v.name
            (model_dir / "1").mkdir(parents=True)
            (model_dir / "1" / "model.onnx").symlink_to(mlp_file)
            modelgen.onnx_mlp_config(model_dir, MLP_DIMS, MAX_BATCH, seed=SEED, **batching)
        else:
            modelgen.python_identity(repo, v.name, delay_ms=PY_DELAY_MS, max_batch_size=MAX_BATCH, **batching)


# --------------------------------------------------------------------------------------------------------------
# server-side evidence: statistics and CPU


def get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.load(r)


def model_stats(port: int, model: str) -> dict[str, object]:
    s = get_json(port, f"/v2/models/{model}/stats")["model_stats"][0]
    return {"inferences": s["inference_count"], "executions": s["execution_count"],
            "batches": {b["batch_size"]: b["compute_infer"]["count"] for b in s.get("batch_stats", [])}}


def stats_delta(before: dict, after: dict) -> dict[str, object]:
    inf = after["inferences"] - before["inferences"]
    exe = after["executions"] - before["executions"]
    hist = {int(k): n - before["batches"].get(k, 0) for k, n in after["batches"].items()}
    hist = {k: n for k, n in sorted(hist.items()) if n}
    return {"inferences": inf, "executions": exe, "avg_batch": inf / exe if exe else 0.0,
            "max_batch": max(hist, default=0), "batch_hist": hist}


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat."""
    vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


# --------------------------------------------------------------------------------------------------------------
# the sweep


FAILED = {"rps": 0.0, "p50_us": 0.0, "p99_us": 0.0, "queue_us": 0.0, "infer_us": 0.0, "failed": True}


def measure(port: int, pid: int, model: str, c: int, args: argparse.Namespace, out_csv: Path) -> dict[str, object]:
    before, cpu0, (busy0, total0), t0 = model_stats(port, model), cpu_seconds(pid), machine_busy(), time.time()
    res: dict[str, object]
    try:
        res = perf(port, c, args.window_ms, out_csv, model=model, stability=args.stability,
                   max_trials=args.max_trials)
    except PerfFailed:
        # no stable window within --max-trials (a busy shared machine): take 3 long windows whatever they say
        # (perf_analyzer still wants 3 windows within -s of each other: 10000 % accepts anything), marked
        try:
            res = perf(port, c, 2 * args.window_ms, out_csv, model=model, stability=10000, max_trials=3)
            res["unstable"] = True
        except PerfFailed as e:
            print(f"[bench] {model} c={c}: {e}", flush=True)
            res = dict(FAILED)
    wall = time.time() - t0
    busy1, total1 = machine_busy()
    res.update(stats_delta(before, model_stats(port, model)))
    res["server_cores"] = (cpu_seconds(pid) - cpu0) / wall
    res["machine_busy"] = (busy1 - busy0) / max(1, total1 - total0)
    res["seconds"] = wall
    return res


def summarize(runs: list[dict]) -> dict[str, object]:
    """Median of the rounds that did not fail, per number; ``unstable`` if any round was; the raw rounds kept."""
    ok = [r for r in runs if not r.get("failed")] or runs
    out: dict[str, object] = {k: statistics.median(r[k] for r in ok) for k in ok[0]
                              if isinstance(ok[0][k], int | float) and not isinstance(ok[0][k], bool)}
    out["max_batch"] = max(r["max_batch"] for r in ok)
    out["unstable"] = any(r.get("unstable") for r in ok)
    out["failed"] = all(r.get("failed") for r in runs)
    out["rounds"] = runs
    return out


def sweep(port: int, pid: int, variants: list[Variant], conc: list[int], args: argparse.Namespace,
          work: Path) -> dict[str, dict[int, dict]]:
    """Rounds x concurrencies x models, models interleaved at each concurrency so that load from elsewhere on
    the machine hits the configurations being compared alike."""
    runs: dict[str, dict[int, list[dict]]] = {v.name: {c: [] for c in conc} for v in variants}
    todo = [(rnd, c, v) for rnd in range(args.rounds) for c in conc for v in variants]
    start = time.time()
    for i, (rnd, c, v) in enumerate(todo, 1):
        r = measure(port, pid, v.name, c, args, work / "pa.csv")
        runs[v.name][c].append(r)
        elapsed = time.time() - start
        remaining = elapsed / i * (len(todo) - i)
        flag = "  FAILED" if r.get("failed") else "  UNSTABLE" if r.get("unstable") else ""
        print(f"[bench {i:2d}/{len(todo)} {elapsed:4.0f}s elapsed, ~{remaining:4.0f}s left] round {rnd + 1} "
              f"{v.name:16s} c={c:<3d}{r['rps']:8.1f} infer/s  p50 {r['p50_us'] / 1000:7.2f} ms  "
              f"p99 {r['p99_us'] / 1000:7.2f} ms  avg batch {r['avg_batch']:5.2f} (max {r['max_batch']})  "
              f"queue {r['queue_us'] / 1000:6.2f} ms  server {r['server_cores']:.2f} cores  "
              f"machine {100 * r['machine_busy']:3.0f}% busy{flag}", flush=True)
    return {name: {c: summarize(rs) for c, rs in per.items()} for name, per in runs.items()}


def check_configs(port: int, variants: list[Variant]) -> dict[str, dict]:
    """The configs as the server reports them; refuse to measure if batching is not what the variant says."""
    out = {}
    for v in variants:
        cfg = get_json(port, f"/v2/models/{v.name}/config")
        has = "dynamic_batching" in cfg
        if has != v.batching:
            raise SystemExit(f"{v.name}: the server's config {'has' if has else 'lacks'} dynamic_batching: {cfg}")
        groups = cfg.get("instance_group", [])
        out[v.name] = {"dynamic_batching": cfg.get("dynamic_batching"), "max_batch_size": cfg["max_batch_size"],
                       "instances": sum(int(g.get("count", 1)) for g in groups)}
    return out


# --------------------------------------------------------------------------------------------------------------
# report


def points(data: dict, model: str) -> list[tuple[int, dict]]:
    """(concurrency, result) of one model, by concurrency (JSON turned the keys into strings)."""
    return sorted((int(c), r) for c, r in data["results"].get(model, {}).items())


def ratio(data: dict, num: str, den: str, c: int) -> tuple[float | None, list[float]]:
    """Ratio of the medians, and the ratio within each round (the two were measured back to back)."""
    a, b = dict(points(data, num)).get(c), dict(points(data, den)).get(c)
    if not (a and b and b["rps"]):
        return None, []
    rounds = [x["rps"] / y["rps"] for x, y in zip(a.get("rounds", []), b.get("rounds", []), strict=False) if y["rps"]]
    return a["rps"] / b["rps"], rounds


def mark(r: dict) -> str:
    return "failed" if r.get("failed") else f"{r['rps']:.1f}{' ⚠' if r.get('unstable') else ''}"


def report(data: dict) -> str:
    configs, ceil = data["configs"], data["ceiling"]
    lines = [
        f"perf_analyzer (HTTP, batch 1 per request) against triton_actor, {data['date']}, {data['cpus']} CPUs, "
        f"load average before the run {data['load_before'][0]:.2f}. ONNX Runtime: {ceil['intra_op_threads']} "
        "intra-op thread(s) per session (half the cores, one instance), inter-op 1, no spinning.",
        "",
        f"In-process ONNX Runtime, MLP {'→'.join(map(str, MLP_DIMS))} ({ceil['model_mb']:.0f} MB): batch 1 "
        f"{ceil['batch1_ms']:.2f} ms, batch {MAX_BATCH} {ceil['batch16_ms']:.2f} ms = {ceil['cost_ratio']:.2f}x "
        f"batch 1, so batching can pay at most {ceil['ceiling']:.1f}x ({ceil['ceiling_rps']:.0f} vs "
        f"{1000 / ceil['batch1_ms']:.0f} infer/s).",
        "",
        "| model | batching | inst. | c | infer/s | p50 ms | p99 ms | avg batch (max) | queue ms | server cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in data["variants"]:
        cfg = configs[v["name"]]
        db = cfg["dynamic_batching"]
        batching = "no" if db is None else ("delay " + str(db.get("max_queue_delay_microseconds", 0)) + " µs"
                                            + (f", pref. {db['preferred_batch_size']}"
                                               if db.get("preferred_batch_size") else ""))
        for c, r in points(data, v["name"]):
            lines.append(
                f"| {v['name']} | {batching} | {cfg['instances']} | {c} | {mark(r)}"
                f" | {r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | {r['avg_batch']:.2f} ({r['max_batch']}) | "
                f"{r['queue_us'] / 1000:.2f} | {r['server_cores']:.2f} |")
    lines += ["", "| ratio (infer/s) | concurrency | measured (medians) | per round | issue 6 goal | met |",
              "|---|---|---|---|---|---|"]
    for num, den, c, least, goal in RATIOS:
        val, per_round = ratio(data, num, den, c)
        shown, met = ("n/a", "not measured") if val is None else (f"{val:.2f}x", "yes" if val >= least else "no")
        lines.append(f"| {num} / {den} | {c} | {shown} | {', '.join(f'{r:.2f}x' for r in per_round)} | {goal} | "
                     f"{met} |")
    lines += ["", f"Medians of {data.get('rounds', 1)} round(s), models interleaved at each concurrency. "
              "avg batch = inference_count / execution_count from the statistics endpoint over the point's "
              "perf_analyzer run; queue = perf_analyzer's server queue time per request; server cores = CPU "
              "seconds of the server process per wall second (the machine's other load is in the JSON); batching = the "
              "config as the server reports it (an empty preferred_batch_size becomes [max_batch_size], as in Triton). "
              "⚠ = perf_analyzer found no stable window within --max-trials; three long windows reported."]
    return "\n".join(lines)


def write_csv(data: dict, path: Path) -> None:
    keys = ["rps", "p50_us", "p99_us", "avg_batch", "max_batch", "queue_us", "infer_us", "server_cores",
            "machine_busy", "unstable"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batching", "instances", "concurrency", *keys])
        for v in data["variants"]:
            for c, r in points(data, v["name"]):
                w.writerow([v["name"], v["batching"], v["count"], c, *(r.get(k, "") for k in keys)])


def plot(data: dict, dst: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [(f, t) for f, t in (("mlp", f"ONNX MLP {'→'.join(map(str, MLP_DIMS))}"),
                                    ("python", "Python identity, 5 ms sleep"))
                if any(v["family"] == f for v in data["variants"])]
    fig, axes = plt.subplots(len(families), 2, figsize=(11, 3.75 * len(families)), squeeze=False)
    for row, (family, title) in enumerate(families):
        ax_rps, ax_p99 = axes[row]
        for v in (v for v in data["variants"] if v["family"] == family):
            pts = points(data, v["name"])
            xs = [c for c, _ in pts]
            style = "-o" if v["batching"] else "--s"
            ax_rps.plot(xs, [r["rps"] for _, r in pts], style, label=v["label"])
            ax_p99.plot(xs, [r["p99_us"] / 1000 for _, r in pts], style, label=v["label"])
            if v["batching"]:
                for c, r in pts:
                    ax_rps.annotate(f"b={r['avg_batch']:.1f}", (c, r["rps"]), textcoords="offset points",
                                    xytext=(0, 6), ha="center", fontsize=7)
        if family == "mlp" and "ceiling" in data:
            ax_rps.axhline(data["ceiling"]["ceiling_rps"], color="grey", lw=0.8, ls=":",
                           label=f"in-process ORT batch {MAX_BATCH} ceiling")
        for ax, what, unit in ((ax_rps, "throughput", "infer/s"), (ax_p99, "p99 latency", "ms")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(c) for c in xs])
            ax.set_xlabel("concurrency (perf_analyzer, HTTP)")
            ax.set_ylabel(unit)
            ax.set_title(f"{title}: {what}", fontsize=10)
            ax.set_ylim(0, ax.get_ylim()[1] * 1.1)  # room for the batch-size labels
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"triton_actor dynamic batching and instances ({data['cpus']} CPUs, {data['date']}; "
                 "b = average executed batch size from the statistics API)", fontsize=9)
    fig.tight_layout()
    dst.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dst, dpi=100)
    print(f"[bench] wrote {dst}", flush=True)


def measure_ceiling(mlp_file: Path, seconds: float, repeats: int) -> dict[str, float]:
    """In-process ORT at batch 1 and 16, alternated ``repeats`` times (medians: the machine may be shared)."""
    b1s, b16s = [], []
    for _ in range(repeats):
        b1s.append(in_process(mlp_file, 1, seconds, width=MLP_DIMS[0]))
        b16s.append(in_process(mlp_file, MAX_BATCH, seconds, width=MLP_DIMS[0]))
    b1, b16 = statistics.median(b1s), statistics.median(b16s)
    cost = b1 / b16  # time of a batch of 16 / time of a batch of 1
    return {"batch1_ms": 1000 / b1, "batch16_ms": 1000 / b16, "cost_ratio": cost, "ceiling": MAX_BATCH / cost,
            "ceiling_rps": MAX_BATCH * b16, "intra_op_threads": max(1, (os.cpu_count() or 1) // 2),
            "model_mb": mlp_file.stat().st_size / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="c=1,4,16, 1.5 s windows, fewer trials")
    ap.add_argument("--concurrency", help="comma-separated (default 1,2,4,8,16; --quick 1,4,16)")
    ap.add_argument("--models", default=",".join(v.name for v in VARIANTS),
                    help="comma-separated subset of: " + ", ".join(v.name for v in VARIANTS))
    ap.add_argument("--window-ms", type=int, help="perf_analyzer -p (default 3000; --quick 1500)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the sweep, report medians (default 1)")
    ap.add_argument("--stability", type=int, default=25, help="perf_analyzer -s, percent (default 25)")
    ap.add_argument("--max-trials", type=int, help="perf_analyzer --max-trials (default 8; --quick 5)")
    ap.add_argument("--mlp-delay-us", type=int, default=1000, help="max_queue_delay_microseconds of mlp_batch")
    ap.add_argument("--mlp-preferred", default="8,16", help="preferred_batch_size of mlp_batch ('' for none)")
    ap.add_argument("--py-delay-us", type=int, default=1000, help="max_queue_delay_microseconds, py_count1_batch")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "bench_batching.png")
    ap.add_argument("--replot", type=Path, metavar="JSON", help="only redraw the plot and table from a run's JSON")
    args = ap.parse_args()
    if args.replot:
        data = json.loads(args.replot.read_text())
        print(report(data))
        plot(data, args.plot)
        return 0
    conc = [int(c) for c in (args.concurrency or ("1,4,16" if args.quick else "1,2,4,8,16")).split(",")]
    args.window_ms = args.window_ms or (1500 if args.quick else 3000)
    args.max_trials = args.max_trials or (5 if args.quick else 8)
    args.mlp_preferred = [int(b) for b in args.mlp_preferred.split(",") if b.strip()]
    by_name = {v.name: v for v in VARIANTS}
    unknown = [m for m in args.models.split(",") if m not in by_name]
    if unknown:
        raise SystemExit(f"unknown --models {unknown}; known: {list(by_name)}")
    variants = [by_name[m] for m in args.models.split(",")]
    if not (TOOLS / "perf_analyzer").exists():
        raise SystemExit(f"{TOOLS}/perf_analyzer missing: run scripts/install_bench_tools.sh")
    args.out.mkdir(parents=True, exist_ok=True)

    load_before = os.getloadavg()
    mlp_file = cached_mlp(MLP_DIMS, SEED)
    ceiling = measure_ceiling(mlp_file, 1.5, 1 if args.quick else 3)
    print(f"[bench] in-process ORT: batch 1 {ceiling['batch1_ms']:.2f} ms, batch {MAX_BATCH} "
          f"{ceiling['batch16_ms']:.2f} ms ({ceiling['cost_ratio']:.2f}x): batching ceiling {ceiling['ceiling']:.1f}x",
          flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_batching_"))
    proc: subprocess.Popen | None = None
    try:
        repo = work / "repo"
        build_repo(repo, mlp_file, variants, args)
        port = free_port()
        log = work / "server.log"
        proc = start_ours(repo, port, "--disable-auto-complete-config", "--log-info=true", log=log)
        try:
            wait_ready(port, proc, timeout=180)
        except SystemExit:
            print(f"[bench] server log:\n{log.read_text(errors='replace')[-4000:]}", flush=True)
            raise
        configs = check_configs(port, variants)
        print(f"[bench] server ready on port {port}: {args.rounds} round(s) x {len(conc)} concurrencies x "
              f"{len(variants)} models, "
              f"windows {args.window_ms} ms, -s {args.stability}, --max-trials {args.max_trials}", flush=True)
        results = sweep(port, proc.pid, variants, conc, args, work)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    data = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "load_before": load_before, "load_after": os.getloadavg(), "argv": sys.argv[1:],
            "rounds": args.rounds, "variants": [v.__dict__ for v in variants], "configs": configs, "ceiling": ceiling,
            "results": results}
    table = report(data)
    print(table)
    (args.out / "batching.md").write_text(table + "\n")
    (args.out / "batching.json").write_text(json.dumps(data, indent=1))
    write_csv(data, args.out / "batching.csv")
    try:
        plot(data, args.plot)
    except ImportError:
        print("[bench] matplotlib missing (pip install -e '.[bench]'): no plot; rerun with --replot", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

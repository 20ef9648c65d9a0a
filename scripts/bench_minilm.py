#!/usr/bin/env python3
"""The all-MiniLM-L6-v2 pipeline's throughput with and without dynamic batching on its encoder (perf_analyzer).

Two runs of our server (``--disable-auto-complete-config``: ONNX Runtime's auto-complete would turn dynamic
batching on for a config without it, as Triton's does), each on a repository written by ``scripts/minilm.py``: ``batching`` (the encoders have
``dynamic_batching { max_queue_delay_microseconds: --delay-us }``) and ``no_batching`` (no dynamic_batching). For
each, perf_analyzer drives ``--model`` (``minilm_ensemble`` by default; ``minilm_bls`` works too) over HTTP with
one sentence per request (``--string-data``) at every ``--concurrency``; the encoder's statistics read before and
after give the average batch it executed (inference_count / execution_count), the proof that batching happened.

    scripts/install_bench_tools.sh                                  # once: perf_analyzer
    .venv/bin/pip install -e ".[onnx,examples,bench]"
    .venv/bin/python scripts/bench_minilm.py                        # c = 1,4,8; about 3 minutes
    .venv/bin/python scripts/bench_minilm.py --replot bench_out/minilm.json

Writes ``bench_out/minilm.{json,md}`` and ``docs/bench_minilm.png`` (matplotlib, the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import minilm  # noqa: E402
from bench_http import PerfFailed, free_port, perf, start_ours, stop_servers, wait_ready  # noqa: E402

ENCODER = "minilm_encoder_onnx"
SENTENCE = "Triton serves this sentence-embedding pipeline from one Python process."


def encoder_counts(port: int) -> tuple[int, int]:
    url = f"http://127.0.0.1:{port}/v2/models/{ENCODER}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def run_variant(name: str, batching: bool, args: argparse.Namespace, work: Path) -> list[dict[str, float]]:
    repo = work / name
    minilm.write_pipeline(repo, dynamic_batching=batching, max_queue_delay_us=args.delay_us)
    port = free_port()
    # without it the ONNX Runtime auto-complete turns dynamic batching on (Triton's does too, max_batch_size > 0)
    proc = start_ours(repo, port, "--disable-auto-complete-config", log=work / f"{name}.log")
    rows = []
    try:
        wait_ready(port, proc, timeout=180)
        for c in args.concurrency:
            inf0, exe0 = encoder_counts(port)
            try:
                row = perf(port, c, args.window_ms, work / f"{name}_c{c}.csv", model=args.model,
                           stability=args.stability, max_trials=args.max_trials,
                           extra=("--string-data", SENTENCE))
            except PerfFailed as e:
                print(f"[bench_minilm] {name} c={c}: {e}", file=sys.stderr)
                continue
            inf1, exe1 = encoder_counts(port)
            row.update(concurrency=c, encoder_batch=(inf1 - inf0) / max(exe1 - exe0, 1))
            print(f"[bench_minilm] {name:12s} c={c:2d} {row['rps']:8.1f} infer/s  p50 {row['p50_us'] / 1000:6.1f} ms"
                  f"  encoder batch {row['encoder_batch']:.2f}")
            rows.append(row)
    finally:
        stop_servers([proc], work / "nothing_to_remove")
    return rows


def report(data: dict) -> str:
    lines = [f"model `{data['model']}`, one sentence per request, HTTP, encoder delay {data['delay_us']} µs", "",
             "| variant | concurrency | infer/s | p50 ms | p99 ms | encoder batch |", "|---|---|---|---|---|---|"]
    for variant, rows in data["variants"].items():
        for r in rows:
            lines.append(f"| {variant} | {r['concurrency']} | {r['rps']:.1f} | {r['p50_us'] / 1000:.1f} | "
                         f"{r['p99_us'] / 1000:.1f} | {r['encoder_batch']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(data: dict, dst: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, rows in data["variants"].items():
        ax.plot([r["concurrency"] for r in rows], [r["rps"] for r in rows], marker="o", label=variant)
    ax.set_xlabel("concurrency (perf_analyzer)")
    ax.set_ylabel("sentences / s")
    ax.set_title(f"all-MiniLM-L6-v2 {data['model']}: encoder dynamic batching")
    ax.grid(alpha=0.3)
    ax.legend()
    dst.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm_ensemble")
    ap.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 8])
    ap.add_argument("--delay-us", type=int, default=2000, help="the encoder's max_queue_delay_microseconds")
    ap.add_argument("--window-ms", type=int, default=4000)
    ap.add_argument("--stability", type=int, default=25)
    ap.add_argument("--max-trials", type=int, default=6)
    ap.add_argument("--replot", type=Path, help="plot a saved bench_out/minilm.json, measure nothing")
    args = ap.parse_args()
    out = ROOT / "bench_out"
    if args.replot:
        data = json.loads(args.replot.read_text())
    else:
        data = {"model": args.model, "delay_us": args.delay_us, "when": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                     time.gmtime()), "variants": {}}
        with tempfile.TemporaryDirectory() as tmp:
            for name, batching in (("no_batching", False), ("batching", True)):
                data["variants"][name] = run_variant(name, batching, args, Path(tmp))
        out.mkdir(exist_ok=True)
        (out / "minilm.json").write_text(json.dumps(data, indent=1))
        (out / "minilm.md").write_text(report(data))
    print(report(data))
    plot(data, ROOT / "docs" / "bench_minilm.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

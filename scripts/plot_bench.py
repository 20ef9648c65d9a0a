#!/usr/bin/env python3
"""Plot ``bench_out/http.json`` (from scripts/bench_http.py) as ``docs/bench_http.png``.

    .venv/bin/pip install -e ".[bench]"
    .venv/bin/python scripts/plot_bench.py [bench_out/http.json] [docs/bench_http.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench_out" / "http.json"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "bench_http.png"
    data = json.loads(src.read_text())
    med = data["median"]
    servers = list(med)
    conc = sorted({int(c) for s in servers for c in med[s]})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(servers)
    for k, name in enumerate(servers):
        xs = [i + k * width for i in range(len(conc))]
        rps = [med[name][str(c)]["rps"] for c in conc]
        p99 = [med[name][str(c)]["p99_us"] for c in conc]
        ax1.bar(xs, rps, width, label=name)
        ax2.bar(xs, p99, width, label=name)
        for x, v in zip(xs, rps, strict=True):
            ax1.annotate(f"{v:.0f}", (x, v), ha="center", va="bottom", fontsize=8)
    for ax, title, unit in ((ax1, "throughput", "infer/s"), (ax2, "p99 latency", "µs")):
        ax.set_xticks([i + width * (len(servers) - 1) / 2 for i in range(len(conc))], [f"c={c}" for c in conc])
        ax.set_title(f"add_sub over HTTP: {title}")
        ax.set_ylabel(unit)
        ax.legend()
    mem = data.get("memory_mb", {})
    fig.suptitle("perf_analyzer, same machine, same run; resident memory: "
                 + ", ".join(f"{n} {v:.0f} MB" for n, v in mem.items()), fontsize=9)
    fig.tight_layout()
    dst.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Draw the Grafana dashboard's panels (deploy/grafana/triton-actor-dashboard.json) from a real run, as
``docs/dashboard.png``: Grafana is not installable on our machines, so this plots the same queries' results.

The run: the dashboard test with ``TRITON_ACTOR_DASHBOARD_OUT`` set keeps its traffic going and writes every
query's range (Prometheus ``/api/v1/query_range``, 1 s steps) to that file::

    TRITON_ACTOR_DASHBOARD_OUT=/tmp/dashboard_run.json .venv/bin/python -m pytest -q \\
        tests/integration/test_grafana_dashboard.py
    .venv/bin/python scripts/plot_dashboard.py /tmp/dashboard_run.json docs/dashboard.png   # needs .[bench]
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "triton-actor-dashboard.json"
SCALE = {"percentunit": (100, "%"), "bytes": (1 / 2**30, "GiB"), "µs": (1, "µs"), "reqps": (1, "req/s"),
         "ops": (1, "/s"), "watt": (1, "W"), "s": (1, "s"), "percent": (1, "%"), "none": (1, "")}
COLUMNS = 4


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or str(labels)


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _draw(ax, panel: dict, runs: dict[tuple[str, str], list], start: float) -> None:
    factor, unit = SCALE.get(panel["fieldConfig"]["defaults"]["unit"], (1, ""))
    drawn = 0
    for target in panel["targets"]:
        for series in runs.get((panel["title"], target["refId"]), []):
            points = [(float(t) - start, float(v) * factor) for t, v in series["values"] if math.isfinite(float(v))]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=_legend(target.get("legendFormat", ""), series["metric"])[:40], lw=1.2)
                drawn += 1
    ax.set_title(f"{panel['title']}" + (f" ({unit})" if unit else ""), fontsize=9)
    ax.tick_params(labelsize=7)
    if drawn:
        ax.legend(fontsize=6, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def main() -> int:
    src = Path(sys.argv[1])
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "dashboard.png"
    run = json.loads(src.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    # the run lists the queries in the dashboard's order: pair each with its panel and refId again
    targets = [(p["title"], t["refId"]) for p in _panels(dashboard) for t in p["targets"]]
    assert [q["panel"] for q in run["queries"]] == [title for title, _ in targets], "run and dashboard differ"
    runs = {key: q["result"] for key, q in zip(targets, run["queries"], strict=True)}
    panels = _panels(dashboard)
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(4.2 * COLUMNS, 2.6 * rows))
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw(ax, panel, runs, run["start"])
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']}: the dashboard's queries over a {run['end'] - run['start']:.0f} s run "
                 "(x: seconds)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title
    fig.savefig(dst, dpi=64)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

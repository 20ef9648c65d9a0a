"""The report's PNG plots, drawn with matplotlib when it is installed (``pip install triton-actor[tune]``).

Throughput against p99 latency for every point, the Pareto front joined and the pick marked (the budget as
a vertical line); and the best throughput per instance count and per ``max_batch_size`` (where more than
one was measured). Without
matplotlib nothing is drawn and the report says so: the CSV and the HTML table carry the same figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from .points import Candidate, Point, pareto


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(out_dir: Path, points: Sequence[Point], chosen: Point | None, budget_ms: float | None) -> list[str]:
    """The file names written into ``out_dir`` (none without matplotlib or without a measured point)."""
    good = [p for p in points if p.ok]
    if not good or not available():
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server host
    import matplotlib.pyplot as plt

    names = [_scatter(plt, out_dir / "throughput_vs_p99.png", good, chosen, budget_ms)]
    if len({p.candidate.instances for p in good}) > 1:  # one value makes no line
        names.append(_best_by(plt, out_dir / "throughput_vs_instances.png", good, lambda c: c.instances, "instances"))
    if len({p.candidate.max_batch_size for p in good}) > 1:
        names.append(_best_by(plt, out_dir / "throughput_vs_batch.png", good, lambda c: c.max_batch_size,
                              "max_batch_size"))
    return names


def _scatter(plt: object, path: Path, good: list[Point], chosen: Point | None, budget_ms: float | None) -> str:
    fig, ax = plt.subplots(figsize=(7, 5))  # type: ignore[attr-defined]
    ax.scatter([p.p99_ms for p in good], [p.throughput for p in good], s=18, color="#7f8c8d", label="points")
    front = pareto(good)
    ax.plot([p.p99_ms for p in front], [p.throughput for p in front], "-o", color="#2980b9", ms=4,
            label="Pareto front")
    if chosen is not None:
        ax.scatter([chosen.p99_ms], [chosen.throughput], s=160, marker="*", color="#e67e22", zorder=5,
                   label=f"pick: {chosen.candidate.label()}, {chosen.load_label()}")
    if budget_ms is not None:
        ax.axvline(budget_ms, color="#c0392b", ls="--", lw=1, label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: never over a point
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _best_by(plt: object, path: Path, good: list[Point], key: Callable[[Candidate], int], label: str) -> str:
    best: dict[int, float] = {}
    for p in good:
        k = key(p.candidate)
        best[k] = max(best.get(k, 0.0), p.throughput)
    xs = sorted(best)
    fig, ax = plt.subplots(figsize=(5, 3.5))  # type: ignore[attr-defined]
    ax.plot(xs, [best[x] for x in xs], "-o", color="#2980b9")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel(label)
    ax.set_ylabel("best throughput (infer/s)")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _save(plt: object, fig: object, path: Path) -> str:
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path.name

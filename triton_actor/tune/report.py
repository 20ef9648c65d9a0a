"""The result of a run: the terminal table, and the report folder (``points.csv``, ``summary.json``, the PNG
plots of ``plots.py``, ``tuned.pbtxt`` and an ``index.html`` that shows them).

Pure but for writing files; written at the end of a run, and after Ctrl-C with the points measured so far.
"""

from __future__ import annotations

import csv
import html
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import plots
from .points import Candidate, Point, meets, pick, rank_key

CSV_FIELDS = ("index", "phase", "instances", "max_batch_size", "dynamic_batching", "preferred_batch_sizes",
              "max_queue_delay_us", "isolation", "kind", "workers", "model", "concurrency", "request_rate", "throughput", "p50_ms", "p95_ms", "p99_ms", "cv_pct", "stable",
              "windows", "loadgen_cpu_pct", "server_cpu_pct", "server_queue_us", "server_compute_us", "failed_requests",
              "meets_budget", "error")


@dataclass
class Outcome:
    """What a run found; ``tuned_text`` is the pick's ``tuned.pbtxt`` (empty without a pick)."""

    model: str
    objective: str
    budget_ms: float | None
    points: list[Point]
    baseline: Point | None = None  # the shipped config's best point
    elapsed_s: float = 0.0
    interrupted: bool = False
    exhausted: bool = False
    tuned_text: str = ""
    tuned_path: str = ""  # where configs/tuned.pbtxt was written; empty when it was not
    notes: list[str] = field(default_factory=list)
    confirm: list[Point] = field(default_factory=list)  # the shipped config and the pick again, back to back
    # an ensemble: each composing model's pick (its search's best), and the last search's best point, which
    # was measured with every earlier pick loaded (a point of an earlier search had the later models shipped)
    ensemble: dict[str, Candidate] = field(default_factory=dict)
    ensemble_best: tuple[Point | None, bool] | None = None
    tuned_texts: dict[str, str] = field(default_factory=dict)  # an ensemble's: composing model -> its tuned.pbtxt

    @property
    def searched(self) -> tuple[Point | None, bool]:
        """The search's best point (within the budget, and True; or the closest, and False)."""
        if self.ensemble_best is not None:
            return self.ensemble_best
        return pick(self.points, self.objective, self.budget_ms)

    @property
    def chosen(self) -> tuple[Point | None, bool]:
        """What the run picks: the search's best, unless measured again back to back it lost to the shipped
        config (the search's figure was the host's luck, not the configuration's); then the shipped one."""
        if self.refuted() and self.baseline is not None:
            return self.baseline, meets(self.baseline, self.budget_ms)
        return self.searched

    def _pairs(self) -> tuple[list[Point], list[Point]] | None:
        shipped, again = self.confirm[0::2], self.confirm[1::2]
        if not shipped or len(shipped) != len(again) or not all(p.ok for p in self.confirm):
            return None
        return shipped, again

    def gain(self) -> float | None:
        """The search's pick over the shipped config: throughput ratio (objective throughput) or p99 ratio
        (latency); from the back-to-back rounds when there are some (the host's drift cancels)."""
        pairs = self._pairs()
        shipped, chosen = (pairs if pairs else ([self.baseline], [self.searched[0]]))
        if any(p is None or not p.ok for p in [*shipped, *chosen]):
            return None
        if self.objective == "latency":
            return sum(p.p99_ms for p in shipped) / sum(p.p99_ms for p in chosen)  # type: ignore[union-attr]
        return sum(p.throughput for p in chosen) / sum(p.throughput for p in shipped)  # type: ignore[union-attr]

    def refuted(self) -> bool:
        gain = self.gain()
        return self._pairs() is not None and gain is not None and gain < 1

    def verdict(self) -> str:
        chosen, met = self.chosen
        if chosen is None:
            return "no configuration could be measured"
        budget = f"the p99 budget of {self.budget_ms:g} ms" if self.budget_ms is not None else "no latency budget"
        if self.refuted():
            lost = self.searched[0]
            return (f"keeping the shipped config: the search's best, {lost.candidate.label()} at "  # type: ignore[union-attr]
                    f"{lost.load_words()}, measured again back to back gave {self.gain():.2f}x its {self._measure_name()}")  # type: ignore[union-attr]
        if not met:
            return (f"no configuration meets {budget}; the closest: {chosen.candidate.label()} at "
                    f"{chosen.load_words()}, p99 {chosen.p99_ms:.2f} ms")
        gain = self.gain()
        again = ", measured again back to back" if self._pairs() else ""
        factor = f" ({gain:.2f}x the shipped config's {self._measure_name()}{again})" if gain else ""
        unsteady = "" if chosen.stable else f" (never stable: cv {chosen.cv_pct:.0f} %)"
        return (f"pick: {self._label(chosen)} at {chosen.load_words()}: {chosen.throughput:.1f} "
                f"infer/s, p99 {chosen.p99_ms:.2f} ms{unsteady}, within {budget}{factor}")

    def _label(self, chosen: Point) -> str:
        """The pick's configuration; for an ensemble, every composing model's pick."""
        if not self.ensemble:
            return chosen.candidate.label()
        return "; ".join(c.label() for c in self.ensemble.values())

    def _measure_name(self) -> str:
        return "p99" if self.objective == "latency" else "throughput"


def csv_rows(outcome: Outcome) -> list[dict[str, object]]:
    rows = []
    phases = ["search"] * len(outcome.points) + ["confirm"] * len(outcome.confirm)
    for i, (phase, p) in enumerate(zip(phases, outcome.points + outcome.confirm, strict=True), 1):
        c = p.candidate
        rows.append({"index": i, "phase": phase, "instances": c.instances, "max_batch_size": c.max_batch_size,
                     "dynamic_batching": int(c.dynamic_batching), "preferred_batch_sizes": " ".join(map(str, c.preferred)),
                     "max_queue_delay_us": c.queue_delay_us, "isolation": c.isolation, "kind": c.kind, "workers": c.workers, "model": c.model,
                     "concurrency": p.concurrency, "request_rate": p.request_rate,
                     "throughput": round(p.throughput, 3), "p50_ms": round(p.p50_ms, 3), "p95_ms": round(p.p95_ms, 3),
                     "p99_ms": round(p.p99_ms, 3), "cv_pct": round(p.cv_pct, 2), "stable": int(p.stable),
                     "windows": p.windows, "loadgen_cpu_pct": round(p.loadgen_cpu_pct, 1), "server_cpu_pct": round(p.server_cpu_pct, 1),
                     "server_queue_us": round(p.queue_us, 1), "server_compute_us": round(p.compute_us, 1),
                     "failed_requests": p.errors, "meets_budget": int(meets(p, outcome.budget_ms)), "error": p.error})
    return rows


def table(outcome: Outcome, limit: int = 12) -> str:
    """Each candidate's best point (as the pick is chosen), best first; the pick and the baseline marked, failures counted."""
    by_candidate: dict[object, list[Point]] = {}
    for p in outcome.points:
        by_candidate.setdefault(p.candidate, []).append(p)
    best = {c: chosen for c, ps in by_candidate.items() if (chosen := pick(ps, outcome.objective, outcome.budget_ms)[0])}
    chosen, _ = outcome.chosen
    ranked = sorted(best.values(), key=lambda p: (meets(p, outcome.budget_ms), rank_key(p, outcome.objective)), reverse=True)
    column = "req/s" if any(p.request_rate for p in outcome.points) else "conc"
    head = f"{'':2} {'configuration':66} {column:>5} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cv %':>5} {'srv cpu%':>8} {'lg cpu%':>7}"
    lines = [head, "-" * len(head)]
    for p in ranked[:limit]:
        mark = "*" if p is chosen else ("b" if outcome.baseline is not None and p.candidate == outcome.baseline.candidate else "")
        flag = "" if meets(p, outcome.budget_ms) else " over budget"
        lines.append(f"{mark:2} {p.candidate.label():66} {p.level:>5g} {p.throughput:>9.1f} {p.p50_ms:>8.2f} "
                     f"{p.p99_ms:>8.2f} {p.cv_pct:>5.1f} {p.server_cpu_pct:>8.0f} {p.loadgen_cpu_pct:>7.0f}{flag}")
    failed = [p for p in outcome.points if p.error]
    if len(ranked) > limit:
        lines.append(f"   ... {len(ranked) - limit} more configurations in points.csv")
    if failed:
        lines.append(f"   {len(failed)} failed point(s), e.g. {failed[0].candidate.label()}: {failed[0].error[:120]}")
    for shipped, again in zip(outcome.confirm[0::2], outcome.confirm[1::2], strict=False):
        lines.append(f"   again, back to back at {shipped.load_words()}: the shipped config "
                     f"{shipped.throughput:.1f}/s p99 {shipped.p99_ms:.2f} ms, the search's best {again.throughput:.1f}/s "
                     f"p99 {again.p99_ms:.2f} ms")
    if outcome.interrupted:
        lines.append("   interrupted: the points measured before the stop")
    lines.append("* pick, b the shipped config; " + outcome.verdict())
    return "\n".join(lines)


def write(out_dir: Path, outcome: Outcome) -> Path:
    """Write the report folder; returns the path of ``index.html``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "points.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(outcome))
    if outcome.tuned_text:
        (out_dir / "tuned.pbtxt").write_text(outcome.tuned_text, encoding="utf-8")
    for model, text in outcome.tuned_texts.items():
        (out_dir / f"tuned-{model}.pbtxt").write_text(text, encoding="utf-8")
    chosen, met = outcome.chosen
    images = plots.draw(out_dir, outcome.points, chosen, outcome.budget_ms)
    if not images and not plots.available():
        outcome.notes.append("matplotlib is not installed: no plots (pip install 'triton-actor[tune]')")
    summary = {"model": outcome.model, "objective": outcome.objective, "budget_ms": outcome.budget_ms,
               "verdict": outcome.verdict(), "met_budget": met, "gain": outcome.gain(), "points": len(outcome.points),
               "elapsed_s": round(outcome.elapsed_s, 1), "interrupted": outcome.interrupted,
               "exhausted": outcome.exhausted, "noise_cv_pct": _noise(outcome.points), "tuned_path": outcome.tuned_path,
               "pick": asdict(chosen) if chosen else None, "kept_shipped": outcome.refuted(),
               "search_best": asdict(outcome.searched[0]) if outcome.searched[0] else None, "notes": outcome.notes,
               "ensemble": {name: asdict(c) for name, c in outcome.ensemble.items()}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    path = out_dir / "index.html"
    path.write_text(_html(outcome, images, summary), encoding="utf-8")
    return path


def _noise(points: list[Point]) -> float | None:
    cvs = [p.cv_pct for p in points if p.ok]
    return round(statistics.median(cvs), 2) if cvs else None


def _html(outcome: Outcome, images: list[str], summary: dict[str, object]) -> str:
    esc = html.escape
    rows = csv_rows(outcome)
    head = "".join(f"<th>{esc(k)}</th>" for k in CSV_FIELDS)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(r[k]))}</td>" for k in CSV_FIELDS) + "</tr>" for r in rows)
    facts = [f"objective: {outcome.objective}", f"points: {len(outcome.points)} in {outcome.elapsed_s:.0f} s",
             f"median coefficient of variation (the machine's noise): {summary['noise_cv_pct']} %"]
    if outcome.interrupted:
        facts.append("interrupted (Ctrl-C): the points measured so far")
    if outcome.exhausted:
        facts.append("the time or point budget ended the search")
    facts += outcome.notes
    pictures = "".join(f'<p><img src="{esc(name)}" alt="{esc(name)}"></p>' for name in images)
    tuned = f"<h2>tuned.pbtxt</h2><pre>{esc(outcome.tuned_text)}</pre>" if outcome.tuned_text else ""
    tuned += "".join(f"<h2>{esc(model)}: tuned.pbtxt</h2><pre>{esc(text)}</pre>" for model, text in outcome.tuned_texts.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tune {esc(outcome.model)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
            f"<h1>triton-actor tune: {esc(outcome.model)}</h1><p><b>{esc(outcome.verdict())}</b></p>"
            f"<ul>{''.join(f'<li>{esc(x)}</li>' for x in facts)}</ul>{pictures}{tuned}"
            f"<h2>Every point</h2><table><tr>{head}</tr>{body}</table></body></html>")

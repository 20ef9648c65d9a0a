"""The report (``triton_actor/tune/report.py``, ``plots.py``): CSV of every point, summary, plots, HTML,
and the terminal table, including a failed point, an unmet budget and a run cut short."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from triton_actor.tune import plots, report
from triton_actor.tune.points import Candidate, Point, pareto

BASE = Candidate(instances=1, max_batch_size=8, dynamic_batching=True)
TWO = Candidate(instances=2, max_batch_size=8, dynamic_batching=True)
BIG = Candidate(instances=2, max_batch_size=64, dynamic_batching=True)


def _points() -> list[Point]:
    return [Point(BASE, 1, throughput=100, p50_ms=9, p95_ms=10, p99_ms=11, cv_pct=2, stable=True, windows=3),
            Point(BASE, 4, throughput=150, p50_ms=20, p95_ms=25, p99_ms=30, cv_pct=4, stable=True, windows=3),
            Point(TWO, 1, throughput=180, p50_ms=5, p95_ms=6, p99_ms=7, cv_pct=3, stable=True, windows=4),
            Point(TWO, 4, throughput=300, p50_ms=12, p95_ms=14, p99_ms=16, cv_pct=5, stable=True, windows=3),
            Point(BIG, 1, error="load failed: out of memory")]


def _outcome(budget_ms: float | None) -> report.Outcome:
    points = _points()
    return report.Outcome("m", "throughput", budget_ms, points, baseline=points[1], elapsed_s=12.0,
                          tuned_text="# tuned\nname: \"m\"\n")


def test_report_folder_has_every_point_the_plots_and_the_page(tmp_path: Path) -> None:
    outcome = _outcome(20.0)
    index = report.write(tmp_path, outcome)
    with (tmp_path / "points.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and tuple(rows[0]) == report.CSV_FIELDS
    assert rows[4]["error"] == "load failed: out of memory" and rows[4]["meets_budget"] == "0"
    assert [r["meets_budget"] for r in rows[:4]] == ["1", "0", "1", "1"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["met_budget"] and summary["gain"] == 2.0 and summary["pick"]["candidate"]["instances"] == 2
    assert (tmp_path / "tuned.pbtxt").read_text() == outcome.tuned_text
    page = index.read_text()
    for name in ("throughput_vs_p99.png", "throughput_vs_instances.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG" and f'src="{name}"' in page
    assert not (tmp_path / "throughput_vs_batch.png").exists()  # one max_batch_size loaded: no line to draw
    assert "2.00x the shipped config" in page and "out of memory" in page


def test_a_budget_no_point_meets_names_the_closest(tmp_path: Path) -> None:
    outcome = _outcome(5.0)
    assert outcome.chosen == (outcome.points[2], False)
    assert outcome.verdict().startswith("no configuration meets the p99 budget of 5 ms; the closest: 2 inst")
    report.write(tmp_path, outcome)
    assert json.loads((tmp_path / "summary.json").read_text())["met_budget"] is False


def test_table_marks_the_pick_and_the_baseline_and_counts_failures() -> None:
    text = report.table(_outcome(None))
    lines = text.splitlines()
    assert lines[2].startswith("*  2 inst, batch 8") and "300.0" in lines[2]
    assert any(line.startswith("b  1 inst, batch 8") for line in lines)
    assert "1 failed point(s)" in text and "1.00x" not in text


def test_without_matplotlib_the_report_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "available", lambda: False)
    outcome = _outcome(None)
    outcome.interrupted = True
    index = report.write(tmp_path, outcome)
    assert not list(tmp_path.glob("*.png"))
    assert "matplotlib is not installed" in index.read_text() and "interrupted (Ctrl-C)" in index.read_text()


def test_pareto_front() -> None:
    assert pareto(_points()) == [_points()[2], _points()[3]]


def test_the_gain_comes_from_the_back_to_back_pair_when_there_is_one(tmp_path: Path) -> None:
    outcome = _outcome(None)
    outcome.confirm = [Point(BASE, 4, throughput=120, p99_ms=30, stable=True),
                       Point(TWO, 4, throughput=180, p99_ms=17, stable=True)]
    assert outcome.gain() == 1.5 and "1.50x the shipped config's throughput, measured again back to back" in outcome.verdict()
    assert "again, back to back at concurrency 4: the shipped config 120.0/s" in report.table(outcome)
    report.write(tmp_path, outcome)
    with (tmp_path / "points.csv").open() as f:
        phases = [r["phase"] for r in csv.DictReader(f)]
    assert phases == ["search"] * 5 + ["confirm"] * 2


def test_table_shows_each_configurations_point_within_the_budget() -> None:
    line = next(x for x in report.table(_outcome(20.0)).splitlines() if x.startswith("b "))
    assert line.split()[-7:-5] == ["1", "100.0"]  # concurrency 1 (p99 11 ms), not 4 (30 ms, over the budget)


def test_the_pick_is_a_stable_point_when_one_meets_the_budget() -> None:
    outcome = _outcome(None)
    lucky = Point(BIG, 4, throughput=900, p50_ms=9, p95_ms=10, p99_ms=11, cv_pct=40, stable=False, windows=8)
    outcome.points.append(lucky)
    assert outcome.chosen == (outcome.points[3], True)  # 300/s, stable, not the lucky 900/s
    outcome.points[:] = [lucky]
    assert outcome.chosen == (lucky, True) and "(never stable: cv 40 %)" in outcome.verdict()


def test_a_pick_that_loses_back_to_back_gives_way_to_the_shipped_config(tmp_path: Path) -> None:
    outcome = _outcome(None)
    outcome.confirm = [Point(BASE, 4, throughput=150, p99_ms=30, stable=True), Point(TWO, 4, throughput=120, p99_ms=17, stable=True),
                       Point(BASE, 4, throughput=160, p99_ms=30, stable=True), Point(TWO, 4, throughput=130, p99_ms=17, stable=True)]
    assert outcome.searched[0] is outcome.points[3] and outcome.refuted()
    assert outcome.chosen == (outcome.baseline, True)
    assert outcome.verdict() == ("keeping the shipped config: the search's best, 2 inst, batch 8, dynamic (delay 0 us) at "
                                 "concurrency 4, measured again back to back gave 0.81x its throughput")
    assert report.table(outcome).count("again, back to back") == 2
    report.write(tmp_path, outcome)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kept_shipped"] and summary["pick"]["candidate"]["instances"] == 1
    assert summary["search_best"]["candidate"]["instances"] == 2

"""One run of ``tune/command.py`` against a fake server and a fake load generator (no sockets, no
processes): what an attached server is left with, with and without ``--apply``; a server that stops
answering and a Ctrl-C still end in a report of the points measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scripts import modelgen
from triton_actor.errors import TritonError
from triton_actor.repository import config as cm
from triton_actor.tune import command
from triton_actor.tune.measure import Measurer
from triton_actor.tune.target import Target

PBTXT = """name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


ENSEMBLE = modelgen.ensemble_chain_config("pipe", ["a", "b"])


def _served(text: str, name: str = "m") -> dict[str, Any]:
    cfg = cm.parse_text(text.replace('name: "m"', f'name: "{name}"'), name, "config.pbtxt")
    cm.normalize(cfg, name, gpu_count=0)
    return cm.to_json_dict(cfg)


class FakeServer:
    """What ``Target`` offers, over a dict of served configs; more instances serve more (up to 4). With
    ``ensemble`` the model is ``pipe``, of the composing models ``a`` and ``b``; ``restartable``: as a
    server started here, ``--workers`` restarts it."""

    url, protocol = "127.0.0.1:1", "http"
    restore = Target.restore  # the real logic, over this fake's load and config_of

    def __init__(self, fail_statistics_after: int | None = None, *, ensemble: bool = False,
                 restartable: bool = False) -> None:
        self.model = "pipe" if ensemble else "m"
        self.originals = {"pipe": _served(ENSEMBLE, "pipe"), "a": _served(PBTXT, "a"), "b": _served(PBTXT, "b")} \
            if ensemble else {"m": _served(PBTXT)}
        self.configs = dict(self.originals)
        self.loads: list[str | None] = []
        self.fail_after = fail_statistics_after
        self.proc, self.restartable, self.workers, self.restarts = (object() if restartable else None), restartable, 1, []

    @property
    def original(self) -> dict[str, Any]:
        return self.originals[self.model]

    @property
    def current(self) -> dict[str, Any]:
        return self.configs[self.model]

    def config_json(self) -> dict[str, Any]:
        return self.current

    def config_of(self, model: str) -> dict[str, Any]:
        return self.configs[model]

    def load(self, config_json: str | None, model: str = "") -> None:
        name = model or self.model
        self.loads.append(config_json)
        self.configs[name] = self.originals[name] if config_json is None else _served_json(config_json, name)

    def restart(self, workers: int) -> None:
        self.restarts.append(workers)
        self.workers, self.configs = workers, dict(self.originals)

    def statistics(self, model: str = "") -> dict[str, float]:
        if self.fail_after is not None:
            self.fail_after -= 1
            if self.fail_after < 0:
                raise TritonError.unavailable("connection refused")
        return {"count": 0.0, "executions": 0.0, "queue_ns": 0.0, "compute_ns": 0.0}

    def cpu_seconds(self) -> float | None:
        return None

    def register_report(self, folder: Path) -> str:
        self.report = folder
        return "registered"

    def close(self) -> None:
        pass


def _served_json(text: str, name: str = "m") -> dict[str, Any]:
    cfg = cm.parse_json(text, name)
    cm.normalize(cfg, name, gpu_count=0)
    return cm.to_json_dict(cfg)


@pytest.fixture
def fake_loadgen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def run(self: Measurer, concurrency: int) -> dict[str, Any]:
        calls.append(concurrency)
        n = min(c.instances for c in self.loaded.values())  # an ensemble: its slowest step
        rate = 100.0 * min(n, 4) * self.target.workers * min(concurrency, 4) / 4  # each worker adds as much
        return {"throughput": rate, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "cv_pct": 1.0, "stable": True,
                "windows": 3, "loadgen_cpu_pct": 10.0, "errors": 0, "error": ""}

    monkeypatch.setattr(Measurer, "_run_loadgen", run)
    return calls


def _args(tmp_path: Path, *extra: str, model: str = "m") -> Any:
    for name, text in ({"m": PBTXT} if model == "m" else {"pipe": ENSEMBLE, "a": PBTXT, "b": PBTXT}).items():
        model_dir = tmp_path / "repo" / name
        model_dir.mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(text.replace('name: "m"', f'name: "{name}"'))
    return command.parser().parse_args(["--model", model, "--model-repository", str(tmp_path / "repo"),
                                        "--concurrency", "4", "--instances", "1,2,4", "--isolation", "thread",
                                        "--dynamic-batching", "on", "--no-preferred", "--queue-delays-us", "0",
                                        "--max-batch-sizes", "8", "--workers", "1", *extra])


def test_attached_without_apply_the_server_gets_its_config_back(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server, args = FakeServer(), _args(tmp_path, "--url", "127.0.0.1:1")
    outcome = command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    assert outcome.chosen[0] is not None and outcome.chosen[0].candidate.instances == 4
    assert len(server.loads) > 2 and server.loads[-1] is None and server.current == server.original
    assert not (tmp_path / "repo" / "m" / "configs").exists() and (tmp_path / "out" / "tuned.pbtxt").is_file()
    assert (tmp_path / "repo" / "m" / "config.pbtxt").read_text() == PBTXT


def test_attached_with_apply_the_pick_is_loaded_and_written(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server, args = FakeServer(), _args(tmp_path, "--url", "127.0.0.1:1", "--apply")
    outcome = command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    assert server.current["instance_group"][0]["count"] == 4
    assert outcome.tuned_path == str(tmp_path / "repo" / "m" / "configs" / "tuned.pbtxt")
    tuned, _ = cm.read(tmp_path / "repo" / "m", "m", auto_complete=False, config_name="tuned")
    assert tuned.instance_group[0].count == 4


def test_a_server_that_stops_answering_ends_the_search_with_a_report(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server, args = FakeServer(fail_statistics_after=3), _args(tmp_path)
    outcome = command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    assert len(outcome.points) == 1 and "the search stopped: connection refused" in outcome.notes
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["points"] == 1 and "the search stopped: connection refused" in summary["notes"]


def test_ctrl_c_keeps_the_points_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          fake_loadgen: list[int]) -> None:
    measured = Measurer._run_loadgen

    def interrupted(self: Measurer, concurrency: int) -> dict[str, Any]:
        if len(fake_loadgen) == 2:
            raise KeyboardInterrupt
        return measured(self, concurrency)

    monkeypatch.setattr(Measurer, "_run_loadgen", interrupted)
    outcome = command.run(_args(tmp_path), FakeServer(), tmp_path / "out")  # type: ignore[arg-type]
    assert outcome.interrupted and len(outcome.points) == 2 and not outcome.confirm
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["interrupted"]


def test_an_ensemble_tunes_its_composing_models_in_turn(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server, args = FakeServer(ensemble=True), _args(tmp_path, "--url", "127.0.0.1:1", "--apply", model="pipe")
    outcome = command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    assert [c.instances for c in outcome.ensemble.values()] == [4, 4] and list(outcome.ensemble) == ["a", "b"]
    models = [p.candidate.model for p in outcome.points]
    # the shipped set, then a (b given 4 instances meanwhile: a is not measured behind b), then b, then a
    # second round that moves nothing (each step is the pipeline's limit at 4 instances) and ends the search
    assert models == ["a"] * 4 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    a_searched = outcome.points[1:4]
    assert [p.throughput for p in a_searched] == [100.0, 200.0, 400.0]  # not held at b's shipped 1 instance
    b_first = outcome.points[4]  # b's search starts with a's pick loaded
    assert b_first.candidate.instances == 1 and b_first.throughput == 100.0
    assert server.configs["pipe"] == server.originals["pipe"]  # the ensemble itself has nothing to tune
    for name in ("a", "b"):
        assert server.configs[name]["instance_group"][0]["count"] == 4  # --apply: both picks loaded
        tuned, _ = cm.read(tmp_path / "repo" / name, name, auto_complete=False, config_name="tuned")
        assert tuned.instance_group[0].count == 4
        assert (tmp_path / "out" / f"tuned-{name}.pbtxt").is_file()
    assert not (tmp_path / "repo" / "pipe" / "configs").exists()


def test_an_attached_ensemble_gets_every_composing_config_back(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server, args = FakeServer(ensemble=True), _args(tmp_path, "--url", "127.0.0.1:1", model="pipe")
    command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    assert server.configs == server.originals


def test_workers_restart_the_started_server_and_the_pick_names_them(tmp_path: Path, fake_loadgen: list[int]) -> None:
    server = FakeServer(restartable=True)
    args = _args(tmp_path)
    args.workers = (1, 2)
    outcome = command.run(args, server, tmp_path / "out")  # type: ignore[arg-type]
    chosen = outcome.chosen[0]
    assert chosen is not None and chosen.candidate.workers == 2
    assert server.restarts[0] == 2 and 1 in server.restarts  # the back-to-back rounds go back to one worker
    assert "triton-actor --workers 2 (a server flag, not a config field)" in outcome.tuned_text


def test_a_clear_first_back_to_back_round_is_not_repeated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fake_loadgen: list[int]) -> None:
    """Four instances serve 4x the shipped one: one back-to-back round decides. Where they serve 1.24x
    (within what the busy host moved one config between rounds) the second round is measured too."""
    outcome = command.run(_args(tmp_path / "clear"), FakeServer(), tmp_path / "clear" / "out")  # type: ignore[arg-type]
    assert outcome.chosen[0] is not None and outcome.chosen[0].candidate.instances == 4
    assert len(outcome.confirm) == 2 and outcome.gain() == 4.0

    def close(self: Measurer, concurrency: int) -> dict[str, Any]:
        n = min(c.instances for c in self.loaded.values())
        return {"throughput": 100.0 + 8 * (n - 1), "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "cv_pct": 1.0,
                "stable": True, "windows": 3, "loadgen_cpu_pct": 10.0, "errors": 0, "error": ""}

    monkeypatch.setattr(Measurer, "_run_loadgen", close)
    outcome = command.run(_args(tmp_path / "close"), FakeServer(), tmp_path / "close" / "out")  # type: ignore[arg-type]
    assert outcome.chosen[0] is not None and outcome.chosen[0].candidate.instances == 4
    assert len(outcome.confirm) == 2 * command.CONFIRM_ROUNDS

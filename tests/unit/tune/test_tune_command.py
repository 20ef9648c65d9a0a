"""One run of ``tune/command.py`` against a fake server and a fake load generator (no sockets, no
processes): what an attached server is left with, with and without ``--apply``; a server that stops
answering and a Ctrl-C still end in a report of the points measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def _served(text: str) -> dict[str, Any]:
    cfg = cm.parse_text(text, "m", "config.pbtxt")
    cm.normalize(cfg, "m", gpu_count=0)
    return cm.to_json_dict(cfg)


class FakeServer:
    """What ``Target`` offers, over a dict; more instances serve more (up to 4)."""

    url, protocol, model, proc = "127.0.0.1:1", "http", "m", None
    restore = Target.restore  # the real logic, over this fake's load and config_json

    def __init__(self, fail_statistics_after: int | None = None) -> None:
        self.original = self.current = _served(PBTXT)
        self.loads: list[str | None] = []
        self.fail_after = fail_statistics_after

    def config_json(self) -> dict[str, Any]:
        return self.current

    def load(self, config_json: str | None) -> None:
        self.loads.append(config_json)
        self.current = self.original if config_json is None else _served_json(config_json)

    def statistics(self) -> dict[str, float]:
        if self.fail_after is not None:
            self.fail_after -= 1
            if self.fail_after < 0:
                raise TritonError.unavailable("connection refused")
        return {"count": 0.0, "executions": 0.0, "queue_ns": 0.0, "compute_ns": 0.0}

    def cpu_seconds(self) -> float | None:
        return None

    def close(self) -> None:
        pass


def _served_json(text: str) -> dict[str, Any]:
    cfg = cm.parse_json(text, "m")
    cm.normalize(cfg, "m", gpu_count=0)
    return cm.to_json_dict(cfg)


@pytest.fixture
def fake_loadgen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def run(self: Measurer, concurrency: int) -> dict[str, Any]:
        calls.append(concurrency)
        n = self.loaded.instances if self.loaded else 1
        rate = 100.0 * min(n, 4) * min(concurrency, 4) / 4
        return {"throughput": rate, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "cv_pct": 1.0, "stable": True,
                "windows": 3, "loadgen_cpu_pct": 10.0, "errors": 0, "error": ""}

    monkeypatch.setattr(Measurer, "_run_loadgen", run)
    return calls


def _args(tmp_path: Path, *extra: str) -> Any:
    model_dir = tmp_path / "repo" / "m"
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(PBTXT)
    return command.parser().parse_args(["--model", "m", "--model-repository", str(tmp_path / "repo"),
                                        "--concurrency", "4", "--instances", "1,2,4", "--isolation", "thread",
                                        "--dynamic-batching", "on", "--no-preferred", "--queue-delays-us", "0",
                                        "--max-batch-sizes", "8", *extra])


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

"""Triton's rate limiter (``--rate-limit=execution_count``) on the real server: instances of two models
that name one resource never run at once, and priorities weight which goes next (counted).

The models are gated (``server.gated_model_py``): a request whose first value is 1 holds its instance
until the test creates the gate file, and every run logs its first value, so the log is the order in
which the instances ran."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from .model_control import wait_for, wait_queued
from .server import add_model, gated_model_py

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R", count: 1 }} ] priority: {priority} }} }} ]
"""


def _repo(tmp_path: Path, priorities: dict[str, int]) -> tuple[Path, Path, Path]:
    repo, log, gate = tmp_path / "repo", tmp_path / "runs.log", tmp_path / "gate"
    for name, priority in priorities.items():
        add_model(repo, name, CONFIG.format(name=name, priority=priority), gated_model_py(log, gate))
    return repo, log, gate


def _runs(log: Path) -> list[float]:
    return [float(line) for line in log.read_text().split()] if log.exists() else []


def _send(client: httpclient.InferenceServerClient, model: str, value: float) -> httpclient.InferAsyncRequest:
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return client.async_infer(model, [x])


def test_two_models_that_share_a_resource_never_run_at_once(tmp_path: Path, start_server) -> None:
    repo, log, gate = _repo(tmp_path, {"holder": 1, "other": 1})
    server = start_server(repo, flags=("--rate-limit=execution_count",))
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    try:
        held = _send(client, "holder", 1.0)  # runs and holds R until the gate opens
        wait_for(lambda: _runs(log) == [1.0], what="the holder running")
        waiting = _send(client, "other", 2.0)
        wait_queued(server.url, "other", 1)  # dispatched as far as it goes: it waits for R
        assert _runs(log) == [1.0]  # other did not start while the holder holds R
        gate.touch()
        assert held.get_result().as_numpy("OUTPUT0").tolist() == [1.0]
        assert waiting.get_result().as_numpy("OUTPUT0").tolist() == [2.0]
        assert _runs(log) == [1.0, 2.0]
    finally:
        client.close()


def test_without_the_rate_limiter_the_other_model_runs_meanwhile(tmp_path: Path, start_server) -> None:
    """The same two models with --rate-limit=off (Triton's default): the resource means nothing."""
    repo, log, gate = _repo(tmp_path, {"holder": 1, "other": 1})
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    try:
        held = _send(client, "holder", 1.0)
        wait_for(lambda: _runs(log) == [1.0], what="the holder running")
        assert _send(client, "other", 2.0).get_result().as_numpy("OUTPUT0").tolist() == [2.0]
        gate.touch()
        held.get_result()
    finally:
        client.close()


def test_priority_two_runs_half_as_often_as_priority_one(tmp_path: Path, start_server) -> None:
    repo, log, gate = _repo(tmp_path, {"holder": 1, "p1": 1, "p2": 2})
    server = start_server(repo, flags=("--rate-limit=execution_count",))
    client = httpclient.InferenceServerClient(server.url, concurrency=64)
    try:
        held = _send(client, "holder", 1.0)
        wait_for(lambda: _runs(log) == [1.0], what="the holder running")
        pending = [_send(client, "p1", 10.0) for _ in range(30)] + [_send(client, "p2", 20.0) for _ in range(30)]
        wait_queued(server.url, "p1", 30)
        wait_queued(server.url, "p2", 30)  # every request waits for R: from here the limiter alone orders them
        gate.touch()
        for request in [held, *pending]:
            request.get_result()
    finally:
        client.close()
    first = _runs(log)[1:31]  # the first 30 runs after the holder's, while both models always wait
    assert first.count(10.0) == 20 and first.count(20.0) == 10, first

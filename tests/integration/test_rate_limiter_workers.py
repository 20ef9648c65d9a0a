"""The rate limiter with ``--workers`` (workers/resources.py): a global resource of count 1 is the host's, so
two models that need it never run at once, in one worker or in two, and a worker that dies holding it
gives it back.

Both models log ``start``/``end`` lines with the worker's pid around each run (model code, into one file);
the holder's request whose value is 1 holds its run until the test creates the gate file. The runs never
overlap when, read in order, no ``start`` follows another before its ``end`` (counts, not times)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPParseError
from tritonclient.utils import InferenceServerException

from .gunicorn_server import Gunicorn
from .model_control import live_status, version_status, wait_for
from .server import add_model

pytestmark = pytest.mark.timeout(240)

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT64, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R", global: true, count: 1 }} ] }} }} ]
"""

LOGGED_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

LOG, GATE = {log!r}, {gate!r}

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            with open(LOG, "a") as f:
                f.write(f"start {{os.getpid()}} {{self.name}}\\n")
            deadline = time.monotonic() + 60  # bounded: a test that fails never opens the gate
            while x.flat[0] == 1.0 and not os.path.exists(GATE) and time.monotonic() < deadline:
                time.sleep(0.01)  # model code polling the test's gate file
            with open(LOG, "a") as f:
                f.write(f"end {{os.getpid()}} {{self.name}}\\n")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], np.int64))]))
        return out
"""


def _repo(tmp_path: Path) -> tuple[Path, Path, Path]:
    repo, log, gate = tmp_path / "repo", tmp_path / "runs.log", tmp_path / "gate"
    for name in ("holder", "other"):
        add_model(repo, name, CONFIG.format(name=name), LOGGED_PY.format(log=str(log), gate=str(gate)))
    return repo, log, gate


def _events(log: Path) -> list[tuple[str, int, str]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [(what, int(pid), model) for what, pid, model in (line.split() for line in lines)]


def _most_at_once(events: list[tuple[str, int, str]]) -> int:
    running = most = 0
    for what, _, _ in events:
        running += 1 if what == "start" else -1
        most = max(most, running)
    return most


def _send(url: str, model: str, value: float) -> tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]:
    """On a connection of its own, so the kernel may give it to either worker."""
    client = httpclient.InferenceServerClient(url, concurrency=1)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return client, client.async_infer(model, [x])


def _waits_in_the_other_worker(url: str) -> bool:
    """A worker that does not hold R has an instance in line for it: it waits for the other worker's unit."""
    return any(part["resources"].get("R@global", [1])[0] == 0 and part["waiting"]
               for part in live_status(url)["rate_limiter"])


def _others_waiting_in_both(url: str) -> list[tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]]:
    """Send 'other' requests eight at a time until one waits in the worker that does not run the holder;
    every one of them waits (none runs while the holder holds R, in its worker or in the other)."""
    sent: list[tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]] = []
    for _ in range(25):
        sent += [_send(url, "other", 2.0) for _ in range(8)]
        count = len(sent)
        wait_for(lambda n=count: version_status(url, "other").get("queued") == n, 30,
                 f"all {count} 'other' requests waiting for R")
        if _waits_in_the_other_worker(url):
            return sent
    raise AssertionError(f"200 connections, none of them given to the second worker: {live_status(url)}")


@contextlib.contextmanager
def _holder_and_others_waiting(tmp_path: Path) -> Iterator[Scene]:
    """Two workers; the holder runs (and holds R) in one, 'other' requests wait in both."""
    repo, log, gate = _repo(tmp_path)
    g = Gunicorn("--model-repository", str(repo), "--rate-limit=execution_count", workers=2)
    sent: list[tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]] = []
    try:
        workers = set(g.wait_serving(2))
        sent.append(_send(g.url, "holder", 1.0))  # runs and holds R until the gate opens
        wait_for(lambda: [e[0] for e in _events(log)] == ["start"], what="the holder running")
        sent += _others_waiting_in_both(g.url)
        assert [e[2] for e in _events(log)] == ["holder"]  # no 'other' started, in either worker
        yield Scene(g, workers, log, gate, sent, _events(log)[0][1])
    finally:
        gate.touch()
        for client, _ in sent:
            client.close()
        g.stop()


@dataclasses.dataclass
class Scene:
    server: Gunicorn
    workers: set[int]
    log: Path
    gate: Path
    sent: list[tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]]
    holding: int  # the pid of the worker whose holder instance holds R


def test_two_models_sharing_a_global_resource_never_run_at_once_across_workers(tmp_path: Path) -> None:
    with _holder_and_others_waiting(tmp_path) as scene:
        scene.gate.touch()
        answered = {int(request.get_result().as_numpy("OUTPUT0")[0]) for _, request in scene.sent}
        assert answered == scene.workers  # both workers ran some
        events = _events(scene.log)
        assert len(events) == 2 * len(scene.sent)
        assert _most_at_once(events) == 1, events


def test_a_worker_that_dies_holding_the_resource_gives_it_back(tmp_path: Path) -> None:
    with _holder_and_others_waiting(tmp_path) as scene:
        os.kill(scene.holding, signal.SIGKILL)  # dies holding R (the gate never opens)
        survivor = (scene.workers - {scene.holding}).pop()
        answered = []
        for _, request in scene.sent:
            try:
                answered.append(int(request.get_result().as_numpy("OUTPUT0")[0]))
            except (InferenceServerException, HTTPParseError, OSError):
                pass  # the requests the killed worker had: their connection went with it
        assert answered and set(answered) == {survivor}, answered
        assert ("start", survivor, "other") in _events(scene.log)

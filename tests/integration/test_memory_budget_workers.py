"""``--model-memory-budget`` with ``--workers`` (plane/memory_budget.py): the budget is the host's, each
worker's copy of a model counts, one decision is made for the host and every worker holds the same
models; loads on demand started in two workers load a model once.

Models of a known size (``test_memory_budget``'s: N MiB of numpy filled in ``initialize``); two real
gunicorn workers, so each model is held twice; a worker that replaces a dead one counts its copies too."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPParseError
from tritonclient.utils import InferenceServerException

from .gunicorn_server import Gunicorn
from .model_control import live_status, wait_for
from .server import IDENTITY_CONFIG, add_model
from .test_memory_budget import MIB, _flags, _infer, _input, _sized

pytestmark = pytest.mark.timeout(240)

# fills 10 MiB, then waits in initialize until the gate file exists (model code polling the test's file)
SLOW_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones(10 * 1024 * 1024, np.uint8)
        deadline = time.monotonic() + 60  # bounded: a test that fails never opens the gate
        while not os.path.exists({gate!r}) and time.monotonic() < deadline:
            time.sleep(0.01)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def _metrics(g: Gunicorn) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{g.metrics_port}/metrics", timeout=30) as scrape:
        text = scrape.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("nv_model_")}


def _ready_rows(url: str) -> dict[str, dict]:
    return {v["name"]: v for v in live_status(url)["versions"] if v["state"] == "READY"}


def test_the_budget_is_the_hosts_and_every_worker_holds_the_same_models(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        _sized(tmp_path, name, 40)
    # each model holds about 45 MiB in each of the two workers: 220 MiB hold two models, not three (a
    # budget per worker would hold four)
    g = Gunicorn("--model-repository", str(tmp_path), *_flags(220), workers=2)
    client = None
    try:
        workers = g.wait_serving(2)
        client = httpclient.InferenceServerClient(g.url)
        for name in ("a", "b", "a"):  # b is now the least recently used
            assert _infer(client, name) == [1.0, 1.0]
        assert _infer(client, "c", 2.0) == [2.0, 2.0]
        rows = _ready_rows(g.url)
        assert set(rows) == {"a", "c"}
        assert all(row["workers"] == 2 for row in rows.values()), rows  # every worker holds both, and only them
        budget = live_status(g.url)["memory_budget"]
        assert budget["evictions"] == 1 and [e["model"] for e in budget["recent_evictions"]] == ["b"]
        assert [m["model"] for m in budget["lru"]] == ["a", "c"]
        assert all(80 * MIB <= m["bytes"] < 110 * MIB for m in budget["lru"]), budget["lru"]  # both copies
        assert budget["used"] <= budget["limit"] == 220 * MIB
        samples = _metrics(g)
        assert samples["nv_model_memory_budget_limit_bytes"] == 220 * MIB  # the host's, not one per worker
        assert samples["nv_model_memory_evictions_total"] == 1
        assert samples['nv_model_memory_resident_bytes{model="a"}'] == budget["lru"][0]["bytes"]
        assert 'nv_model_memory_resident_bytes{model="b"}' not in samples
        assert g.log().count("memory budget: evicting 'b'") == 1
        os.kill(workers[0], signal.SIGKILL)  # its replacement replays the journal: a and c, counted as its share
        g.wait_serving(3)
        rows = _ready_rows(g.url)
        assert set(rows) == {"a", "c"} and all(row["workers"] == 2 for row in rows.values()), rows
        lru = live_status(g.url)["memory_budget"]["lru"]
        assert all(80 * MIB <= m["bytes"] < 110 * MIB for m in lru), lru  # the new worker's copies count
    finally:
        if client is not None:
            client.close()
        g.stop()


Sent = list[tuple[httpclient.InferenceServerClient, httpclient.InferAsyncRequest]]


@contextlib.contextmanager
def _loads_started_in_both(tmp_path: Path) -> Iterator[tuple[Gunicorn, Path, Sent]]:
    """Two workers, each with a request that started a load of the cold model 'slow' (whose initialize
    waits at the gate): one of them decides and loads, the other waits for the host lock."""
    gate = tmp_path / "gate"
    add_model(tmp_path / "repo", "slow", IDENTITY_CONFIG, SLOW_PY.format(gate=str(gate)))
    g = Gunicorn("--model-repository", str(tmp_path / "repo"), *_flags(200), workers=2)
    sent: Sent = []
    try:
        g.wait_serving(2)
        for _ in range(25):  # fresh connections until both workers started a load (the first one waits at the gate)
            for _ in range(8):
                c = httpclient.InferenceServerClient(g.url, concurrency=1, network_timeout=120)
                sent.append((c, c.async_infer("slow", [_input(3.0)])))
            if _started_in_both(g):
                break
        assert _started_in_both(g), g.log()
        yield g, gate, sent
    finally:
        gate.touch()
        for c, _ in sent:
            c.close()
        g.stop()


def test_loads_on_demand_started_in_two_workers_load_the_model_once(tmp_path: Path) -> None:
    with _loads_started_in_both(tmp_path) as (g, gate, sent):
        gate.touch()
        assert all(r.get_result().as_numpy("OUTPUT0").tolist() == [3.0, 3.0] for _, r in sent)
        assert g.log().count("memory budget: loaded 'slow'") == 1  # one decision, one load in each worker
        assert live_status(g.url)["memory_budget"]["loads"] == 1
        assert _ready_rows(g.url)["slow"]["workers"] == 2


def test_a_worker_killed_during_its_load_on_demand_lets_the_other_decide(tmp_path: Path) -> None:
    with _loads_started_in_both(tmp_path) as (g, gate, sent):
        deciding = _holder_of(_run_dir(g) / "memory-budget.lock")
        os.kill(deciding, signal.SIGKILL)  # dies holding the host lock, in the middle of the load
        gate.touch()
        answered = []
        for _, request in sent:
            try:
                answered.append(request.get_result().as_numpy("OUTPUT0").tolist())
            except (InferenceServerException, HTTPParseError, OSError):
                pass  # the requests the killed worker had: their connection went with it
        assert answered and all(a == [3.0, 3.0] for a in answered), answered  # the other worker loaded it
        assert g.log().count("memory budget: loaded 'slow'") == 1  # the survivor's decision


def _run_dir(g: Gunicorn) -> Path:
    m = re.search(r"triton_actor: run directory (\S+)", g.stderr.text())
    assert m is not None, g.log()
    return Path(m.group(1))


def _holder_of(lock: Path) -> int:
    """The pid holding an exclusive ``flock`` on ``lock`` (``/proc/locks``)."""
    inode = f":{lock.stat().st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "FLOCK" and fields[5].endswith(inode):
            return int(fields[4])
    raise AssertionError(f"nobody holds {lock}")


def _started_in_both(g: Gunicorn) -> bool:
    """Both workers logged that a request started the load (each worker starts at most one at a time)."""
    try:
        wait_for(lambda: g.log().count("loading 'slow' on demand") >= 2, 2, "a load on demand in both workers")
        return True
    except AssertionError:
        return False

"""``--model-memory-budget`` (plane/memory_budget.py) on the real server with ``--model-load-on-demand``: models of a
known size (a Python model that fills N MiB of numpy in ``initialize``, and a sparse weights file of that
size, so the estimate before the first load is right too); the least recently used idle model is evicted
for a new one, a pinned (``--load-model``) model never is, a model larger than the budget is refused, a
request racing the eviction of its model is answered, a reload's old version counts until it has drained, and
the metrics and status page show it."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.runtime.process_memory import process_bytes, tree_pids

from .model_control import index, live_status, wait_for
from .server import IDENTITY_CONFIG, add_model
from .test_status_page import _chromium

MIB = 1 << 20

SIZED_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones({mib} * 1024 * 1024, np.uint8)  # every page touched: resident

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]

    def finalize(self):
        gate = {gate!r}
        if gate:
            open(gate + ".finalizing", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)  # model code polling the test's gate file
"""


def _sized(repo: Path, name: str, mib: int, gate: str = "") -> None:
    model_dir = add_model(repo, name, IDENTITY_CONFIG, SIZED_PY.format(mib=mib, gate=gate))
    with open(model_dir / "1" / "weights.bin", "wb") as f:  # sparse: its size is the estimate, no disk used
        f.truncate(mib * MIB)


def _flags(budget_mib: int, *more: str) -> tuple[str, ...]:
    return ("--model-control-mode=explicit", "--model-load-on-demand", f"--model-memory-budget={budget_mib}M", *more)


def _infer(client: httpclient.InferenceServerClient, name: str, value: float = 1.0) -> list[float]:
    return client.infer(name, [_input(value)]).as_numpy("OUTPUT0").tolist()


def _ready(client: httpclient.InferenceServerClient) -> set[str]:
    return {name for (name, _), entry in index(client).items() if entry.get("state") == "READY"}


def test_the_least_recently_used_model_makes_room_and_metrics_and_status_show_it(tmp_path: Path,
                                                                                  start_server) -> None:
    for name in ("a", "b", "c"):
        _sized(tmp_path, name, 40)
    server = start_server(tmp_path, flags=_flags(110))
    client = httpclient.InferenceServerClient(server.url)
    for name in ("a", "b", "a"):  # b is now the least recently used
        assert _infer(client, name) == [1.0, 1.0]
    assert _ready(client) == {"a", "b"}
    assert _infer(client, "c", 2.0) == [2.0, 2.0]
    assert _ready(client) == {"a", "c"}
    assert "memory budget: evicting 'b'" in server.log()
    budget = live_status(server.url)["memory_budget"]
    assert [m["model"] for m in budget["lru"]] == ["a", "c"]
    assert [e["model"] for e in budget["recent_evictions"]] == ["b"] and budget["evictions"] == 1
    assert all(40 * MIB <= m["bytes"] < 55 * MIB for m in budget["lru"]), budget["lru"]  # measured, not guessed
    assert budget["used"] <= budget["limit"] == 110 * MIB
    with urllib.request.urlopen(server.metrics_url, timeout=30) as scrape:
        text = scrape.read().decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nv_model_")}
    assert samples["nv_model_load_on_demand_total"] == 3
    assert samples["nv_model_memory_evictions_total"] == 1
    assert samples['nv_model_memory_resident_bytes{model="a"}'] == budget["lru"][0]["bytes"]
    assert 'nv_model_memory_resident_bytes{model="b"}' not in samples
    assert samples["nv_model_memory_budget_limit_bytes"] == 110 * MIB
    assert samples["nv_model_memory_budget_used_bytes"] <= 110 * MIB
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", f"http://{server.url}/status")  # the page shows it
    lru = re.search(r'<tbody id="lru">(.*?)</tbody>', dom, re.S)
    assert lru is not None and re.findall(r'<tr><td class="l">(\w+)</td>', lru.group(1)) == ["a", "c"], dom[-3000:]
    assert "memory budget:" in dom and "b (" in dom  # the last eviction


def test_a_pinned_model_is_never_evicted(tmp_path: Path, start_server) -> None:
    for name in ("pinned", "a", "b"):
        _sized(tmp_path, name, 40)
    server = start_server(tmp_path, flags=_flags(110, "--load-model=pinned"))
    client = httpclient.InferenceServerClient(server.url)
    assert _ready(client) == {"pinned"}
    assert _infer(client, "a") == [1.0, 1.0]
    assert _infer(client, "b") == [1.0, 1.0]  # pinned is the least recently used, a goes
    assert _ready(client) == {"pinned", "b"}
    assert live_status(server.url)["memory_budget"]["pinned"] == ["pinned"]


def test_a_model_larger_than_the_budget_is_refused_clearly(tmp_path: Path, start_server) -> None:
    _sized(tmp_path, "small", 10)
    _sized(tmp_path, "huge", 200)
    server = start_server(tmp_path, flags=_flags(100))
    client = httpclient.InferenceServerClient(server.url)
    assert _infer(client, "small") == [1.0, 1.0]
    with pytest.raises(InferenceServerException, match="more than the model memory budget of 104857600 bytes"):
        _infer(client, "huge")
    assert _ready(client) == {"small"}  # nothing was evicted for it
    assert "memory budget: refused 'huge'" in server.log()


def test_a_request_racing_the_eviction_of_its_model_is_answered(tmp_path: Path, start_server) -> None:
    gate = tmp_path / "gate"
    repo = tmp_path / "repo"
    _sized(repo, "a", 40, gate=str(gate))  # a's finalize waits for the gate: its eviction is under way meanwhile
    _sized(repo, "b", 40)
    _sized(repo, "c", 40)
    server = start_server(repo, flags=_flags(110))
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    for name in ("a", "b"):
        _infer(client, name)
    racing_c = client.async_infer("c", [_input()])  # evicts a, which waits in finalize
    wait_for(lambda: Path(str(gate) + ".finalizing").exists(), what="a's eviction to start")
    racing_a = client.async_infer("a", [_input(7.0)])  # a is going: this request loads it again
    gate.touch()
    assert racing_c.get_result().as_numpy("OUTPUT0").tolist() == [1.0, 1.0]
    assert racing_a.get_result().as_numpy("OUTPUT0").tolist() == [7.0, 7.0]
    assert "a" in _ready(client)
    client.close()


def test_a_reloads_old_version_counts_until_it_has_drained(tmp_path: Path, start_server) -> None:
    """The load API reloads a loaded model: it answers at the swap, and the old version (whose finalize waits
    on the gate) still holds its memory; the budget counts it as draining until it is gone."""
    gate = tmp_path / "gate"
    _sized(tmp_path, "a", 30, gate=str(gate))
    server = start_server(tmp_path, flags=_flags(100))
    client = httpclient.InferenceServerClient(server.url)
    assert _infer(client, "a") == [1.0, 1.0]
    with open(tmp_path / "a" / "1" / "model.py", "a") as f:
        f.write("# changed: the load API reloads what changed\n")
    client.load_model("a")  # answered once the new version serves
    wait_for(lambda: Path(str(gate) + ".finalizing").exists(), what="the old version's finalize")
    budget = live_status(server.url)["memory_budget"]
    assert budget["draining_bytes"] >= 30 * MIB and budget["used"] >= 60 * MIB, budget
    assert _infer(client, "a", 3.0) == [3.0, 3.0]  # the new version serves meanwhile
    gate.touch()
    wait_for(lambda: live_status(server.url)["memory_budget"]["draining_bytes"] == 0, what="the drain to end")
    assert 30 * MIB <= live_status(server.url)["memory_budget"]["used"] < 60 * MIB
    client.close()


def _input(value: float = 1.0) -> httpclient.InferInput:
    x = httpclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.full(2, value, np.float32))
    return x


def test_an_evicted_models_memory_leaves_the_server(tmp_path: Path, start_server) -> None:
    """What the accounting frees is really freed: the server grows by the budget's ``used`` and no more,
    however many models came and went over keep-alive connections (each of which caches its routes)."""
    names = [f"m{i}" for i in range(6)]
    for name in names:
        _sized(tmp_path, name, 30)
    server = start_server(tmp_path, flags=_flags(70))
    clients = [httpclient.InferenceServerClient(server.url) for _ in range(3)]
    start = _server_bytes(server.proc.pid)
    for round_ in range(3):
        for i, name in enumerate(names):
            assert _infer(clients[(i + round_) % 3], name) == [1.0, 1.0]
    used = live_status(server.url)["memory_budget"]["used"]
    assert _server_bytes(server.proc.pid) - start <= used + 16 * MIB  # room for the server's own buffers


def _server_bytes(pid: int) -> int:
    return sum(process_bytes(p, unique=True) for p in tree_pids(pid))


def test_a_burst_for_many_cold_models_is_answered_in_full_and_the_budget_holds(tmp_path: Path, start_server) -> None:
    """Issue 28's burst, scaled to the suite: a request for each of 40 cold models at once, room for about 6:
    the loads queue, every request is answered with its own model's output, and no decision ever used more
    than the budget."""
    names = [f"m{i:02d}" for i in range(40)]
    for name in names:
        _sized(tmp_path, name, 4)
    server = start_server(tmp_path, flags=_flags(30))
    client = httpclient.InferenceServerClient(server.url, concurrency=len(names), network_timeout=300)
    pending = [(i, client.async_infer(name, [_input(float(i))])) for i, name in enumerate(names)]
    assert [p.get_result().as_numpy("OUTPUT0").tolist() for _, p in pending] == [[float(i)] * 2 for i, _ in pending]
    client.close()
    used = [(int(u), int(limit)) for u, limit in re.findall(r"memory budget: loaded .*; (\d+) of (\d+) used", server.log())]
    assert len(used) == len(names) and all(u <= limit for u, limit in used), used
    budget = live_status(server.url)["memory_budget"]
    assert budget["evictions"] >= len(names) - 8 and budget["used"] <= budget["limit"]


def test_an_eviction_whose_finalize_hangs_fails_the_load_and_frees_the_lock(tmp_path: Path, start_server) -> None:
    """The victim's finalize waits on a gate: the load that evicts it fails once --exit-timeout-secs pass
    (before the fix it waited forever and so did every later load); the victim keeps its bytes meanwhile."""
    gate = tmp_path / "gate"
    _sized(tmp_path, "hangs", 40, gate=str(gate))
    _sized(tmp_path, "b", 40)
    _sized(tmp_path, "c", 10)
    server = start_server(tmp_path, flags=_flags(70, "--exit-timeout-secs=2"))
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    assert _infer(client, "hangs") == [1.0, 1.0]
    with pytest.raises(InferenceServerException, match="evicting 'hangs' did not finish within 2 s"):
        _infer(client, "b")
    assert Path(str(gate) + ".finalizing").exists()
    assert server.stderr.wait(lambda: "memory budget: 'hangs' did not finish unloading" in server.log(), 30), \
        server.log()  # the server's stderr reaches the test on a reader of its own
    gate.touch()  # the finalize ends: the model is gone and its bytes with it
    assert _infer(client, "b") == [1.0, 1.0]
    assert _infer(client, "c") == [1.0, 1.0]

"""A BLS caller that waits in a call while its own request ends (the client's deadline, a cancel), while a
request queued behind it times out, while it or its target is unloaded, while the server stops, and
``async_exec`` run by ``asyncio.run`` from a plain ``execute`` or by an ``async def execute``: the server
keeps serving, nothing stays held, the models unload and serve again. With fast paths on, the caller is first
promoted to run its batches in a hub greenlet of its own (``ModelInstance.own``), where its calls are served;
off, it runs on its thread: every test runs both ways in CI."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.runtime import fastpath

from .bls_models import ADDSUB_CONFIG, ADDSUB_PY, CALLER_CONFIG, CALLER_HEAD, CALLER_PY
from .model_control import version_status, wait_for
from .server import ServerProcess, add_model, wait_for_fifo
from .test_bls import SUM, promote, run

# the target a caller waits on: addsub that, given a "fifo" parameter, says so on it once in execute()
# and holds the request until the test's gate file exists (bounded: a failed test never opens it)
HELD_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

GATE = {gate!r}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            params = json.loads(r.parameters())
            if "fifo" in params:
                with open(params["fifo"], "w") as f:
                    f.write("started\\n")
                deadline = time.monotonic() + 60
                while not os.path.exists(GATE) and time.monotonic() < deadline:
                    time.sleep(0.01)  # model code polling the test's gate file
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""

# a plain execute() that runs its BLS calls with asyncio.run (what some Triton examples do)
ASYNCIO_RUN_PY = CALLER_HEAD + """
import asyncio


async def both():
    return await asyncio.gather(addsub_request().async_exec(), addsub_request(names=["OUTPUT1"]).async_exec())


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = mode_of(r)
            if mode == "plain":
                value = {"tid": native_ident()}
            elif mode == "sync":
                value = describe(addsub_request().exec()) | {"tid": native_ident()}
            elif mode == "mixed":  # a call, then asyncio.run: where it runs promoted, the second needs its thread
                first = describe(addsub_request().exec())
                value = {"answers": [first, *(describe(x) for x in asyncio.run(both()))], "tid": native_ident()}
            else:
                value = {"answers": [describe(x) for x in asyncio.run(both())], "tid": native_ident()}
            out.append(answer(value))
        return out
"""

# an ``async def execute`` over ``async_exec`` calls; "tid": the thread its coroutines run on (the
# instance's asyncio loop thread)
ASYNC_DEF_PY = CALLER_HEAD + """
import asyncio


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            if mode_of(r) == "plain":
                value = {"tid": native_ident()}
            else:
                got = await asyncio.gather(addsub_request().async_exec(), addsub_request(names=["OUTPUT1"]).async_exec())
                value = {"answers": [describe(x) for x in got], "tid": native_ident()}
            out.append(answer(value))
        return out
"""

# a caller's config as a load request gives it: loaded with it, a model loaded already is loaded again
RELOADED = {"backend": "python", "input": [{"name": "MODE", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]}],
            "instance_group": [{"kind": "KIND_CPU", "count": 1}], "parameters": {"edition": {"string_value": "2"}}}

# a caller that, once its call to the held target returns, says in the file ``note`` whether its own
# request was cancelled meanwhile (model code polling its request's probe, bounded: a failed test goes on)
AWARE_PY = CALLER_PY + "\nRELOADED = " + repr(RELOADED) + """
import time

_Caller = TritonPythonModel


class TritonPythonModel(_Caller):
    def execute(self, requests):
        mode = mode_of(requests[0])
        if mode == "reload_self":  # model control: its own model loaded again, with a config of its own
            pb_utils.load_model(self.name, config=json.dumps(RELOADED))
            return [answer({"ready": pb_utils.is_model_ready(self.name)})]
        if not mode.startswith("aware:"):
            return super().execute(requests)
        _, fifo, note = mode.split(":")
        before = requests[0].is_cancelled()
        addsub_request(model="slow", parameters={"fifo": fifo}).exec()
        deadline = time.monotonic() + 30
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(note, "w") as f:
            f.write(json.dumps({"before": before, "after": requests[0].is_cancelled()}))
        return [answer({})]
"""

# the caller, with a queue whose requests may set their own timeout (Triton's ``timeout`` parameter)
QUEUED_CALLER_CONFIG = CALLER_CONFIG % 1 + """
dynamic_batching { default_queue_policy { timeout_action: REJECT allow_timeout_override: true
                                          default_timeout_microseconds: 60000000 } }
"""


@pytest.fixture
def held(tmp_path: Path, start_server) -> Iterator[tuple[ServerProcess, Path, Path, Any]]:
    """A server (explicit model control, every model loaded) whose ``caller`` calls ``slow`` (held until
    ``gate`` exists) then ``addsub`` for the mode ``drain:<fifo>``; the caller promoted first (fast paths
    on). Yields the server, the fifo the target writes to once it holds a request, the gate, and an HTTP
    client."""
    repo = tmp_path / "repo"
    gate, fifo = tmp_path / "gate", tmp_path / "started.fifo"
    os.mkfifo(fifo)
    add_model(repo, "addsub", ADDSUB_CONFIG, ADDSUB_PY)
    add_model(repo, "slow", ADDSUB_CONFIG, HELD_PY.format(gate=str(gate)))
    add_model(repo, "caller", CALLER_CONFIG % 1, CALLER_PY)
    add_model(repo, "caller_asyncio", CALLER_CONFIG % 2, ASYNCIO_RUN_PY)
    add_model(repo, "caller_async_def", CALLER_CONFIG % 1, ASYNC_DEF_PY)
    add_model(repo, "caller_queued", QUEUED_CALLER_CONFIG, CALLER_PY)
    add_model(repo, "caller_aware", CALLER_CONFIG % 1, AWARE_PY)
    server = start_server(repo, flags=("--model-control-mode=explicit", "--load-model=*"))
    client = httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=60)
    try:
        if fastpath.enabled:
            promote(client, "caller")
        yield server, fifo, gate, client
    finally:
        gate.touch()  # a test that failed midway lets the held target go
        client.close()


def _mode(mod: Any, mode: str) -> Any:
    i = mod.InferInput("MODE", [1], "BYTES")
    i.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    return i


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, int]:
    s = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return {"success": int(s["success"]["count"]), "fail": int(s["fail"]["count"])}


def _serves_on(client: httpclient.InferenceServerClient, tid: int | None) -> None:
    """The caller answers again, its call served, on the same thread as before (the hub's when promoted)."""
    got = run(client, "caller", "sync")
    assert got["outputs"]["OUTPUT0"] == SUM, got
    if tid is not None:
        assert got["tid"] == tid, (got, tid)


def _nothing_held(server: ServerProcess, *models: str) -> None:
    """Nothing of ``models`` is queued or running, and no instance is busy (the server's own counts):
    each request answered since the test's own ran after them."""
    for model in models:
        status = version_status(server.url, model)
        assert (status["queued"], status["running"], status["busy_instances"]) == (0, 0, 0), status


def _unloads_and_serves_again(client: httpclient.InferenceServerClient, model: str) -> None:
    """Nothing the test left in flight holds ``model``: it unloads (drained), loads and answers again."""
    client.unload_model(model)
    wait_for(lambda: not client.is_model_ready(model), what=f"{model} unloaded")
    client.load_model(model)
    assert client.is_model_ready(model)
    assert run(client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_the_client_goes_while_the_caller_waits_in_a_call(held, how: str) -> None:
    """gRPC: the client cancels its call (RST_STREAM), or its deadline (grpc-timeout) passes, while the
    caller waits in a BLS call. The client gets CANCELLED / DEADLINE_EXCEEDED at once (not when the call
    returns); the caller's run goes on to its end (Triton does not cancel a model's BLS calls for it), the
    instance serves again where it served before, and the caller unloads."""
    server, fifo, gate, client = held
    tid = run(client, "caller", "plain")["tid"] if fastpath.enabled else None
    before = _stats(client, "addsub")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    done = gevent.event.AsyncResult()
    try:
        # the deadline is the test's stimulus, not its wait: it must outlast the caller's way to its call
        # (a queued request past its deadline never runs, and the fifo below would stay silent), so it is
        # long against a busy 2-core host; the held target keeps the caller waiting past it in any case
        call = g.async_infer("caller", [_mode(grpcclient, f"drain:{fifo}")],
                             callback=lambda result, error: done.set((result, error)),
                             client_timeout=None if how == "cancel" else 8.0)
        wait_for_fifo(fifo, server)  # the caller waits in its call to the held target
        if how == "cancel":
            call.cancel()
        result, error = done.get(timeout=60)  # before the gate opens: the call ended while the caller waits
        assert result is None and isinstance(error, InferenceServerException), (result, error)
        assert error.status() == ("StatusCode.CANCELLED" if how == "cancel" else "StatusCode.DEADLINE_EXCEEDED")
        assert not gate.exists()
        gate.touch()
        # the caller's run ends (its second call made), then it serves again
        wait_for(lambda: _stats(client, "addsub")["success"] == before["success"] + 1, what="the caller's second call")
        _serves_on(client, tid)
        assert _stats(client, "slow") == {"success": 1, "fail": 0}
        _nothing_held(server, "caller", "slow")
    finally:
        g.close()
    _unloads_and_serves_again(client, "caller")


def test_the_caller_sees_its_request_cancelled_once_its_call_returns(held, tmp_path: Path) -> None:
    """A gRPC cancel while the caller waits in a call: once the call returns, ``request.is_cancelled()``
    is true in the caller's ``execute`` (promoted: in its hub greenlet), so it can stop there, as Triton's
    python backend lets it."""
    server, fifo, gate, client = held
    note = tmp_path / "note"
    if fastpath.enabled:
        promote(client, "caller_aware")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    done = gevent.event.AsyncResult()
    try:
        call = g.async_infer("caller_aware", [_mode(grpcclient, f"aware:{fifo}:{note}")],
                             callback=lambda result, error: done.set((result, error)))
        wait_for_fifo(fifo, server)
        call.cancel()
        result, error = done.get(timeout=60)
        assert result is None and error.status() == "StatusCode.CANCELLED", (result, error)
        gate.touch()
        run(client, "caller_aware", "plain")  # after the cancelled run, on the caller's one instance
        assert json.loads(note.read_text()) == {"before": False, "after": True}
    finally:
        g.close()
    _nothing_held(server, "caller_aware", "slow")


def test_an_http_client_that_closes_while_the_caller_waits(held) -> None:
    """HTTP: the client closes its connection while the caller waits in a call; the request is counted
    canceled (the caller's own run still ends), and the caller serves and unloads."""
    server, fifo, gate, client = held
    tid = run(client, "caller", "plain")["tid"] if fastpath.enabled else None
    before = _stats(client, "addsub")
    lone = httpclient.InferenceServerClient(server.url, network_timeout=60)
    job = gevent.spawn(lone.infer, "caller", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    job.kill()  # the client's greenlet ends inside its read: its connection closes
    lone.close()
    gate.touch()
    wait_for(lambda: _stats(client, "addsub")["success"] == before["success"] + 1, what="the caller's second call")
    _serves_on(client, tid)
    _nothing_held(server, "caller", "slow")
    _unloads_and_serves_again(client, "caller")


def test_unloading_the_caller_while_it_waits_in_a_call(held) -> None:
    """The caller is unloaded while it waits in a call: the unload drains it (the request is answered in
    full, both calls served), then the model is gone, and it loads and serves again."""
    server, fifo, gate, client = held
    pending = client.async_infer("caller", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    client.unload_model("caller")  # returns at once (as Triton's); the model drains
    assert not gate.exists()
    gate.touch()
    first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
    assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
    wait_for(lambda: not client.is_model_ready("caller"), what="caller unloaded")
    client.load_model("caller")
    assert run(client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM


@pytest.mark.timeout(30)  # without the fix: the load waited for the held call (60 s, the model's bound)
def test_reloading_the_caller_while_it_waits_in_a_call(held) -> None:
    """A load with a config (a reload) while the caller waits in a call returns once the new version serves,
    as Triton's does, and the new version answers while the old one still waits; the old one's request is
    then answered in full, and nothing is held."""
    server, fifo, gate, client = held
    pending = client.async_infer("caller", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    client.load_model("caller", config=json.dumps(RELOADED))
    assert not gate.exists()
    assert run(client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM  # the new version's instance
    gate.touch()
    first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
    assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
    _nothing_held(server, "caller", "slow")


@pytest.mark.timeout(30)  # without the fix: the caller waited for its own request to end, for good
def test_a_caller_that_reloads_its_own_model(held) -> None:
    """``pb_utils.load_model`` of the calling model itself, with a config (promoted: from its hub greenlet):
    the load returns once the new version serves, the caller's request is answered, and the new version
    serves. Before, the load waited for the old version to drain, which waited for that very request."""
    _server, _fifo, _gate, client = held
    if fastpath.enabled:
        promote(client, "caller_aware")
    assert run(client, "caller_aware", "reload_self") == {"ready": True}
    assert run(client, "caller_aware", "sync")["outputs"]["OUTPUT0"] == SUM
    cfg = client.get_model_config("caller_aware")
    assert cfg["parameters"]["edition"]["string_value"] == "2", cfg


def test_unloading_the_target_a_caller_waits_on(held) -> None:
    """The target is unloaded while a caller's call to it runs: that call is answered (the unload drains
    it), the caller's next call to it gets python_backend's error as its response, and the caller serves on."""
    server, fifo, gate, client = held
    tid = run(client, "caller", "plain")["tid"] if fastpath.enabled else None
    pending = client.async_infer("caller", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    client.unload_model("slow")
    gate.touch()
    first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
    assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
    wait_for(lambda: not client.is_model_ready("slow"), what="slow unloaded")
    gone = run(client, "caller", "slow")
    # python_backend's own check before a BLS call (request_executor.cc), its text
    assert gone["error"] == "Failed for execute the inference request. Model 'slow' is not ready.", gone
    _serves_on(client, tid)


def test_the_server_stops_while_the_caller_waits_in_a_call(held) -> None:
    """SIGTERM while a promoted caller waits in a call: the server drains it (the request is answered in
    full, its second call served while the server exits) and exits cleanly. test_bls.py has this for a
    caller on its thread only."""
    server, fifo, gate, client = held
    pending = client.async_infer("caller", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    server.proc.send_signal(signal.SIGTERM)
    assert server.stderr.wait(lambda: "shutting down: waiting" in server.log(), 30), server.log()
    gate.touch()
    first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
    assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
    assert server.wait_exit(60) == 0, server.log()


def test_async_exec_from_asyncio_run_in_a_plain_execute(held) -> None:
    """A plain ``execute`` that runs ``asyncio.run`` over ``async_exec`` calls, on two instances at once:
    every answer right. Promoted (a greenlet of its own on the hub), its first such batch goes back to its
    thread before any call, and the instance keeps it: two ``asyncio.run`` at once on the hub's one thread
    would find each other's loop running."""
    _server, _fifo, _gate, client = held
    hub = promote(client, "caller_asyncio") if fastpath.enabled else None
    jobs = [gevent.spawn(run, client, "caller_asyncio", "asyncio") for _ in range(16)]
    gevent.joinall(jobs, timeout=60, raise_error=True)
    for job in jobs:
        first, second = job.value["answers"]
        assert first["outputs"] == {"OUTPUT0": SUM, "OUTPUT1": [-3.0, -1.0, 1.0, 3.0]}, job.value
        assert second["outputs"] == {"OUTPUT1": [-3.0, -1.0, 1.0, 3.0]}, job.value
        assert job.value["tid"] != hub
    assert run(client, "caller_asyncio", "sync")["outputs"]["OUTPUT0"] == SUM


def test_a_promoted_caller_that_turns_to_async_exec_after_a_call_keeps_its_thread(held) -> None:
    """A promoted caller (its calls served in its hub greenlet) whose execute() makes a call and then runs
    ``asyncio.run`` over ``async_exec``, which needs its thread: that one batch cannot be run again on the
    thread (its first call would be made twice), so it fails with the reason; every batch after runs on the
    thread, where both kinds of call are served. Fast paths off: always on its thread, never an error."""
    server, _fifo, _gate, client = held
    hub = promote(client, "caller_asyncio") if fastpath.enabled else None
    if hub is not None:
        with pytest.raises(InferenceServerException, match="needs its thread after calls served inline"):
            run(client, "caller_asyncio", "mixed")
    for _ in range(5):
        got = run(client, "caller_asyncio", "mixed")
        assert [a["outputs"].get("OUTPUT1") for a in got["answers"]] == [[-3.0, -1.0, 1.0, 3.0]] * 3, got
        assert got["tid"] != hub
    assert ("it keeps its thread" in server.log()) == fastpath.enabled


@pytest.mark.timeout(30)  # the queue's own timeout (60 s) would answer the same, later
def test_a_request_timeout_in_the_queue_of_a_caller_that_waits_in_a_call(held) -> None:
    """Triton's ``timeout`` request parameter: a request queued behind the caller's only instance, which
    waits in a call, expires in the queue and is answered at once with Triton's error (the caller's own run
    goes on); then nothing is held, and the caller serves where it served before."""
    server, fifo, gate, client = held
    tid = promote(client, "caller_queued") if fastpath.enabled else None
    pending = client.async_infer("caller_queued", [_mode(httpclient, f"drain:{fifo}")])
    wait_for_fifo(fifo, server)
    with pytest.raises(InferenceServerException, match=r"^\[503\] \[request id: <id_unknown>\] Request timeout expired$"):
        client.infer("caller_queued", [_mode(httpclient, "sync")], timeout=1000)  # µs
    assert not gate.exists()  # answered while the caller waits
    gate.touch()
    first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
    assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
    got = run(client, "caller_queued", "sync")
    assert got["outputs"]["OUTPUT0"] == SUM and (tid is None or got["tid"] == tid), (got, tid)
    stats = client.get_inference_statistics("caller_queued")["model_stats"][0]["inference_stats"]
    assert int(stats["fail"]["count"]) == 1, stats
    _nothing_held(server, "caller_queued", "slow")


def test_async_exec_from_an_async_def_execute_stays_on_its_loop(held) -> None:
    """An ``async def execute`` over ``async_exec``: every answer right, past the streak of short runs that
    promotes a plain ``execute``; such a model is never promoted (backend.py ``_may_run_inline``), and its
    coroutines always run on the instance's asyncio loop thread (the one thread id it ever reports)."""
    _server, _fifo, _gate, client = held
    loop = run(client, "caller_async_def", "plain")["tid"]
    for _ in range(40):  # more than the 32 short runs that promote
        assert run(client, "caller_async_def", "plain")["tid"] == loop
    for _ in range(3):
        got = run(client, "caller_async_def", "async")
        first, second = got["answers"]
        assert first["outputs"] == {"OUTPUT0": SUM, "OUTPUT1": [-3.0, -1.0, 1.0, 3.0]}, got
        assert second["outputs"] == {"OUTPUT1": [-3.0, -1.0, 1.0, 3.0]}, got
        assert got["tid"] == loop

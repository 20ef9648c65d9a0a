"""BLS (``InferenceRequest.exec`` / ``async_exec``), model control from a model, and request rescheduling,
through the real server and the official tritonclient (models in ``bls_models.py``)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gevent
import gevent.queue
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_actor.runtime import fastpath

from .bls_models import caller_repo, controller_repo
from .model_control import index, wait_for
from .server import ServerProcess, wait_for_fifo

# the callers every test below may use, promoted first in the "promoted" run of this module
PROMOTED = ("caller", "caller_pair", "caller_many", "caller_b")


@pytest.fixture(scope="module", params=["threads", "promoted"])
def bls_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The BLS repository's server; "promoted": with fast paths on, each caller model is first promoted to
    run in a hub greenlet of its own (its calls served there, actors/scheduling/instance.py), so every
    scenario below runs both ways."""
    repo = caller_repo(tmp_path_factory.mktemp("bls_repo"))
    server = ServerProcess(repo).wait_ready()
    if request.param == "promoted" and fastpath.enabled:
        c = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            for model in PROMOTED:
                promote(c, model)
        finally:
            c.close()
    yield server
    server.stop()


def promote(client: Any, model: str) -> int:
    """Make ``model`` (fast paths on) run its batches in a greenlet of its own, as a caller of the server is
    promoted: one call on its thread (recorded), then short runs until one runs on the hub's thread. The
    thread id of its runs from then on (the hub's)."""
    thread = run(client, model, "sync")["tid"]
    for _ in range(400):  # 32 short runs in a row promote; a slow one on a busy machine starts them again
        tid = run(client, model, "plain")["tid"]
        if tid != thread:
            got = run(client, model, "sync")
            assert got["outputs"]["OUTPUT0"] == SUM and got["tid"] == tid, got  # its call served on the hub
            return tid
    raise AssertionError(f"{model} was never promoted")


def _executions(client: Any, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"])


@pytest.fixture
def client(bls_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(bls_server.url, concurrency=16, network_timeout=60)
    yield c
    c.close()


def run(client: Any, model: str, mode: str, mod: Any = httpclient) -> Any:
    """Send ``mode`` to a caller model; return its JSON answer."""
    i = mod.InferInput("MODE", [1], "BYTES")
    i.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    result = client.infer(model, [i])
    return json.loads(result.as_numpy("OUT")[0])


A, B = [1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]
SUM, DIFF = [5.0, 5.0, 5.0, 5.0], [-3.0, -1.0, 1.0, 3.0]


def test_sync_exec_with_parameters(client: httpclient.InferenceServerClient) -> None:
    got = run(client, "caller", "sync")
    assert got["outputs"] == {"OUTPUT0": SUM, "OUTPUT1": DIFF}
    assert json.loads(got["parameters"]["seen"]) == {"k": "v", "n": 3}


def test_sync_exec_over_grpc(bls_server: ServerProcess) -> None:
    c = grpcclient.InferenceServerClient(bls_server.grpc_url)
    try:
        assert run(c, "caller", "sync", grpcclient)["outputs"]["OUTPUT0"] == SUM
    finally:
        c.close()


def test_requested_outputs_and_versions(client: httpclient.InferenceServerClient) -> None:
    assert run(client, "caller", "outputs")["outputs"] == {"OUTPUT1": DIFF}
    v1, v7 = run(client, "caller", "version")
    assert v1["outputs"]["OUTPUT0"] == SUM
    assert v7 == {"error": "Failed for execute the inference request. Model 'addsub' is not ready.", "code": 1}


def test_errors_come_back_as_error_responses(client: httpclient.InferenceServerClient) -> None:
    # Triton's python backend checks readiness first, with its own text (its BLS example prints it)
    assert run(client, "caller", "unknown") == {
        "error": "Failed for execute the inference request. Model 'nope' is not ready.", "code": 1}
    wrong = run(client, "caller", "wrong_inputs")
    assert wrong["code"] == 3  # INVALID_ARG
    assert wrong["error"].startswith("[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'addsub'")


def test_decoupled_exec_yields_every_response(client: httpclient.InferenceServerClient) -> None:
    got = run(client, "caller", "decoupled")
    assert [r["outputs"] for r in got] == [{"OUT": [0]}, {"OUT": [1]}, {"OUT": [2]}, {}]  # the last: final flag only


def test_decoupled_exec_cancelled_by_the_model(client: httpclient.InferenceServerClient) -> None:
    got = run(client, "caller", "cancel")
    assert got["first"]["outputs"] == {"OUT": [0]} and got["rest"] == []
    assert got["after"]["outputs"]["OUTPUT0"] == SUM


def test_async_exec_gather_and_decoupled(client: httpclient.InferenceServerClient) -> None:
    got = run(client, "caller_async", "gather")
    assert [r["outputs"]["OUTPUT0"] for r in got] == [SUM] * 4
    assert [json.loads(r["parameters"]["seen"]) for r in got] == [{"i": i} for i in range(4)]
    assert [r["outputs"] for r in run(client, "caller_async", "decoupled")] == [{"OUT": [0]}, {"OUT": [1]}, {}]
    assert run(client, "caller_async", "error")["error"] == "Failed for execute the inference request. Model 'nope' is not ready."


def test_is_model_ready_from_a_model(client: httpclient.InferenceServerClient) -> None:
    assert run(client, "caller", "ready") == {"addsub": True, "nope": False}


def test_call_to_the_calling_model(client: httpclient.InferenceServerClient) -> None:
    # two instances: the nested call runs on the other one
    assert run(client, "caller_pair", "self")["inner"]["outputs"]["OUTPUT0"] == SUM
    # one instance, and it is the caller: Triton hangs here; we answer an error and keep serving
    got = run(client, "caller", "self")
    assert got["code"] == 4 and "would wait forever" in got["error"], got
    assert run(client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM


def test_cycle_between_two_models(client: httpclient.InferenceServerClient) -> None:
    # caller (one instance) -> caller_b (one instance) -> caller: the innermost call is refused
    got = run(client, "caller", "to:caller_b:to:caller:sync")
    assert got["inner"]["code"] == 4 and "would wait forever" in got["inner"]["error"], got
    # no cycle: caller -> caller_b -> addsub
    assert run(client, "caller", "to:caller_b:sync")["inner"]["outputs"]["OUTPUT0"] == SUM


@pytest.fixture
def quick_client(bls_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    """A client that gives up after 20 s: a cycle that is not refused hangs for good."""
    c = httpclient.InferenceServerClient(bls_server.url, network_timeout=20)
    yield c
    c.close()


def test_cycle_through_an_ensemble(quick_client: httpclient.InferenceServerClient) -> None:
    # caller (one instance) -> ens_caller, whose step is caller: Triton hangs (and so did we: the
    # ensemble has no instances, the wait graph did not look inside); refused as a direct cycle is
    got = run(quick_client, "caller", "to:ens_caller:sync")
    assert got["code"] == 4 and "would wait forever" in got["error"], got
    got = run(quick_client, "caller", "to:ens_nested:sync")  # ens_nested -> ens_caller -> caller
    assert got["code"] == 4 and "would wait forever" in got["error"], got
    # caller -> ens_b -> caller_b -> caller: the step's own BLS call back is refused
    got = run(quick_client, "caller", "to:ens_b:to:caller:sync")
    assert got["inner"]["code"] == 4 and "would wait forever" in got["inner"]["error"], got
    assert run(quick_client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM  # the instance is free again


def test_ensembles_without_a_cycle(quick_client: httpclient.InferenceServerClient) -> None:
    # caller_pair has two instances: the ensemble's step runs on the other one
    assert run(quick_client, "caller_pair", "to:ens_pair:sync")["inner"]["outputs"]["OUTPUT0"] == SUM
    assert run(quick_client, "caller", "to:ens_b:sync")["inner"]["outputs"]["OUTPUT0"] == SUM  # caller -> ens_b -> caller_b
    assert run(quick_client, "caller_b", "to:ens_caller:sync")["inner"]["outputs"]["OUTPUT0"] == SUM


def test_unload_after_a_cycle_through_an_ensemble(tmp_path: Path, start_server) -> None:
    """The refused call leaves the caller's instance free, so its unload finishes (it stayed UNLOADING)."""
    server = start_server(caller_repo(tmp_path / "repo"), flags=("--model-control-mode=explicit", "--load-model=*"))
    c = httpclient.InferenceServerClient(server.url, network_timeout=20)
    try:
        got = run(c, "caller", "to:ens_caller:sync")
        assert got["code"] == 4 and "would wait forever" in got["error"], got
        c.unload_model("caller")
        wait_for(lambda: index(c)[("caller", "1")]["state"] == "UNAVAILABLE", what="caller unloaded")
    finally:
        c.close()


def test_bls_from_a_thread_of_a_decoupled_model(bls_server: ServerProcess) -> None:
    c = grpcclient.InferenceServerClient(bls_server.grpc_url)
    out: gevent.queue.Queue = gevent.queue.Queue()
    c.start_stream(callback=partial(_collect, out))
    try:
        i = grpcclient.InferInput("MODE", [1], "BYTES")
        i.set_data_from_numpy(np.array([b"x"], dtype=object))
        c.async_stream_infer("caller_decoupled", [i], enable_empty_final_response=True)
        answers = []
        while True:
            result, error = out.get(timeout=30)
            assert error is None, error
            if result.get_response().outputs:
                answers.append(json.loads(result.as_numpy("OUT")[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert [a["outputs"]["OUTPUT0"] for a in answers] == [SUM, SUM]
    finally:
        c.stop_stream()
        c.close()


def test_every_target_instance_busy(client: httpclient.InferenceServerClient) -> None:
    # four callers at once, one instance of the target that takes 0.3 s a call: all queue, all answered
    jobs = [gevent.spawn(run, client, "caller_many", "slow") for _ in range(4)]
    gevent.joinall(jobs, timeout=60, raise_error=True)
    assert [j.value["outputs"]["OUTPUT0"] for j in jobs] == [SUM] * 4


def test_under_load(client: httpclient.InferenceServerClient) -> None:
    jobs = [gevent.spawn(run, client, "caller_many", "sync") for _ in range(64)]
    gevent.joinall(jobs, timeout=90, raise_error=True)
    assert all(j.value["outputs"]["OUTPUT1"] == DIFF for j in jobs)


def test_bls_timeout_in_the_target_queue(bls_server: ServerProcess, client: httpclient.InferenceServerClient,
                                         tmp_path: Path) -> None:
    fifo = tmp_path / "started.fifo"
    os.mkfifo(fifo)
    inputs = []
    for name, value in (("INPUT0", A), ("INPUT1", B)):
        i = httpclient.InferInput(name, [1, 4], "FP32")
        i.set_data_from_numpy(np.array([value], np.float32))
        inputs.append(i)
    busy = client.async_infer("slow_queue", inputs, parameters={"fifo": str(fifo)})
    wait_for_fifo(fifo, bls_server)  # the only instance is busy for a second from now
    got = run(client, "caller", "timeout")
    assert got == {"error": "[request id: <id_unknown>] Request timeout expired", "code": 4}, got
    assert busy.get_result().as_numpy("OUTPUT0").tolist() == [SUM]


def test_a_bls_caller_promoted_runs_in_a_greenlet_of_its_own(bls_server: ServerProcess,
                                                               client: httpclient.InferenceServerClient) -> None:
    """A model whose execute() first ran short, promoted inline (fast paths on), then calls BLS: that batch
    runs again on its thread (the call would hold whoever ran it), and the model, now known to call the
    server, is promoted to run in a hub greenlet of its own, where its calls are served with no thread
    crossing; each call reaches the target once. Fast paths off: always its thread."""
    thread = run(client, "caller_inline", "plain")["tid"]
    tids = {run(client, "caller_inline", "plain")["tid"] for _ in range(80)}
    assert (tids != {thread}) == fastpath.enabled  # promoted: execute() ran on the hub's thread
    got = run(client, "caller_inline", "sync")
    assert got["outputs"]["OUTPUT0"] == SUM and got["tid"] == thread
    assert ("caller_inline_0_0 calls the server from execute(): it goes back to its thread"
            in bls_server.log()) == fastpath.enabled
    if not fastpath.enabled:
        assert {run(client, "caller_inline", "sync")["tid"] for _ in range(40)} == {thread}
        return
    hub = promote(client, "caller_inline")
    before = _executions(client, "addsub")
    answers = [run(client, "caller_inline", "sync") for _ in range(20)]
    assert all(a["outputs"]["OUTPUT0"] == SUM and a["tid"] == hub for a in answers)
    assert _executions(client, "addsub") - before == 20


def test_a_promoted_caller_that_fails_after_a_call_is_not_run_again(bls_server: ServerProcess,
                                                                     client: httpclient.InferenceServerClient) -> None:
    """An execute() that raises after its BLS call: the request gets the model's error, as on its thread;
    a failed inline run is otherwise run again on the thread, which here would call the target twice."""
    for _ in range(3):
        before = _executions(client, "counted")
        with pytest.raises(Exception, match="failed after a call"):
            run(client, "caller", "fail_after_call")
        assert _executions(client, "counted") - before == 1
    assert run(client, "caller", "sync")["outputs"]["OUTPUT0"] == SUM


def test_a_promoted_caller_stays_promoted_while_its_target_takes_long(bls_server: ServerProcess,
                                                                      client: httpclient.InferenceServerClient) -> None:
    """The 0.3 s a call to ``slow`` waits (other greenlets run meanwhile) is not the caller's time: a run that
    long by its own wall time would send it back to its thread at once."""
    tid = run(client, "caller", "plain")["tid"]
    assert run(client, "caller", "slow")["outputs"]["OUTPUT0"] == SUM
    assert run(client, "caller", "plain")["tid"] == tid


def _collect(out: gevent.queue.Queue, result: Any, error: Any) -> None:
    out.put((result, error))


def test_reschedule_non_decoupled(client: httpclient.InferenceServerClient) -> None:
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([3], np.int32))
    jobs = [gevent.spawn(client.infer, "reschedule", [i], request_id=f"r{n}") for n in range(3)]
    gevent.joinall(jobs, timeout=60, raise_error=True)
    assert [j.value.as_numpy("OUT").tolist() for j in jobs] == [[3]] * 3  # each seen three times by execute


def test_reschedule_decoupled(bls_server: ServerProcess) -> None:
    c = grpcclient.InferenceServerClient(bls_server.grpc_url)
    out: gevent.queue.Queue = gevent.queue.Queue()
    c.start_stream(callback=partial(_collect, out))
    try:
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([4], np.int32))
        c.async_stream_infer("reschedule_decoupled", [i], request_id="d1", enable_empty_final_response=True)
        values = []
        while True:
            result, error = out.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                values.append(result.as_numpy("OUT").tolist())
            if response.parameters["triton_final_response"].bool_param:
                break
        assert values == [[3], [2], [1], [0]]
    finally:
        c.stop_stream()
        c.close()


def test_bls_while_the_server_drains(tmp_path: Path, start_server) -> None:
    """SIGTERM while a BLS model runs: its next BLS call is still served (Triton core serves
    inference while exiting; only the front ends stop taking requests), the client gets its answer."""
    server = start_server(caller_repo(tmp_path / "repo"))
    fifo = tmp_path / "started.fifo"
    os.mkfifo(fifo)
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        i = httpclient.InferInput("MODE", [1], "BYTES")
        i.set_data_from_numpy(np.array([f"drain:{fifo}".encode()], dtype=object))
        pending = c.async_infer("caller", [i])
        wait_for_fifo(fifo, server)  # the first BLS call is running
        server.proc.send_signal(signal.SIGTERM)
        first, second = json.loads(pending.get_result().as_numpy("OUT")[0])
        assert first["outputs"]["OUTPUT0"] == SUM and second["outputs"]["OUTPUT0"] == SUM, (first, second)
        assert server.wait_exit(60) == 0
    finally:
        c.close()


def test_model_control_from_a_model(tmp_path: Path, start_server) -> None:
    repo = controller_repo(tmp_path)
    server = start_server(repo, flags=("--model-control-mode=explicit", "--load-model=controller"))
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        assert not c.is_model_ready("addsub")
        assert run(c, "controller", "load") == {"ready": True, "v1": True, "v2": False}
        assert c.is_model_ready("addsub")
        made = run(c, "controller", "load_files")  # config and model.py given by the model
        assert made["ready"] and made["answer"]["outputs"]["OUTPUT0"] == [4.0, 6.0, 6.0, 4.0]
        assert run(c, "controller", "bad_load")["error"].startswith("failed to load 'nope'")
        assert run(c, "controller", "unload") == {"unloaded": True}
        wait_for(lambda: not c.is_model_ready("addsub"), what="addsub unloaded")  # unload returns first (Triton)
    finally:
        c.close()

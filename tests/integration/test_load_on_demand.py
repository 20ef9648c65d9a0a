"""``--model-load-on-demand`` (plane/on_demand.py) on the real server, EXPLICIT mode: a request for a model
of the repository that is not loaded loads it and is answered; many requests share one load; a failed load
answers each waiting request with its error and the next request tries again; a name with no folder is
Triton's unknown-model answer and loads nothing; a request's timeout bounds its wait. POLL mode: requests
load models, rescans keep the loaded ones in step with their folders and load nothing new by themselves."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import add_tagged, answers, ask, index, tagged, wait_for
from .server import IDENTITY_CONFIG, IDENTITY_PY, add_model
from .test_lifecycle import BAD_INIT_PY

ON_DEMAND = ("--model-control-mode=explicit", "--model-load-on-demand")

# initialize waits for the test's gate file (bounded): the load is under way for as long as the test needs
SLOW_INIT_PY = """
import os
import time
import triton_python_backend_utils as pb_utils

GATE = {gate!r}

class TritonPythonModel:
    def initialize(self, args):
        deadline = time.monotonic() + 60
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.01)  # model code polling the test's gate file

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def _input(value: float = 3.0, grpc: bool = False):
    module = grpcclient if grpc else httpclient
    x = module.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.full(2, value, np.float32))
    return x


def _loads_logged(server, name: str) -> int:
    return server.log().count(f"loading '{name}' on demand")


def test_a_request_loads_the_model_it_names_over_http_and_grpc(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "cold", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "cold_grpc", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=ON_DEMAND)
    client = httpclient.InferenceServerClient(server.url)
    assert index(client)[("cold", "")].get("state", "") != "READY"  # nothing loaded at start
    assert client.infer("cold", [_input()]).as_numpy("OUTPUT0").tolist() == [3.0, 3.0]
    assert index(client)[("cold", "1")]["state"] == "READY"
    with grpcclient.InferenceServerClient(server.grpc_url) as g:  # ModelInfer starts in the connection's reader
        assert g.infer("cold_grpc", [_input(4.0, grpc=True)]).as_numpy("OUTPUT0").tolist() == [4.0, 4.0]
    assert _loads_logged(server, "cold") == 1 and _loads_logged(server, "cold_grpc") == 1


def test_many_requests_share_one_load(tmp_path: Path, start_server) -> None:
    gate = tmp_path / "gate"
    add_model(tmp_path / "repo", "slow", IDENTITY_CONFIG, SLOW_INIT_PY.format(gate=str(gate)))
    server = start_server(tmp_path / "repo", flags=ON_DEMAND)
    client = httpclient.InferenceServerClient(server.url, concurrency=16)
    pending = [client.async_infer("slow", [_input(float(i))]) for i in range(16)]
    wait_for(lambda: _loads_logged(server, "slow") == 1, what="the load to start")
    gate.touch()
    assert [p.get_result().as_numpy("OUTPUT0")[0] for p in pending] == [float(i) for i in range(16)]
    assert _loads_logged(server, "slow") == 1
    client.close()


def test_a_failed_load_answers_the_waiting_requests_and_the_next_request_tries_again(tmp_path: Path,
                                                                                     start_server) -> None:
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, flags=ON_DEMAND)
    client = httpclient.InferenceServerClient(server.url)
    for attempt in (1, 2):
        with pytest.raises(InferenceServerException, match="initialize failed on purpose"):
            client.infer("bad_init", [_input()])
        assert _loads_logged(server, "bad_init") == attempt
    assert server.proc.poll() is None


def test_a_name_with_no_folder_is_unknown_and_loads_nothing(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "cold", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=ON_DEMAND)
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [_input()])
    assert "Request for unknown model: 'nope' is not found" in str(info.value)
    assert "on demand" not in server.log()


def test_a_requests_timeout_bounds_its_wait_for_the_load(tmp_path: Path, start_server) -> None:
    gate = tmp_path / "gate"
    add_model(tmp_path / "repo", "slow", IDENTITY_CONFIG, SLOW_INIT_PY.format(gate=str(gate)))
    server = start_server(tmp_path / "repo", flags=ON_DEMAND)
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="timeout expired while model 'slow' was loading"):
        client.infer("slow", [_input()], timeout=200_000)  # 0.2 s: the load waits for the gate
    gate.touch()
    wait_for(lambda: index(client).get(("slow", "1"), {}).get("state") == "READY", what="the load to finish")
    assert client.infer("slow", [_input(5.0)]).as_numpy("OUTPUT0").tolist() == [5.0, 5.0]



def test_poll_mode_loads_on_request_and_keeps_only_the_loaded_models_in_step(tmp_path: Path, start_server) -> None:
    model_b = add_tagged(tmp_path, "b", edition=1)
    add_tagged(tmp_path, "pinned", edition=2)
    server = start_server(tmp_path, flags=("--model-control-mode=poll", "--repository-poll-secs=1",
                                           "--model-load-on-demand", "--load-model=pinned"))
    client = httpclient.InferenceServerClient(server.url)
    assert index(client)[("pinned", "1")]["state"] == "READY"
    assert index(client).get(("b", "1"), {}).get("state") != "READY"  # --load-model only, as EXPLICIT
    with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed if polling"):
        client.load_model("b")  # the load API stays refused in POLL mode, as in Triton
    assert ask(client, "b") == 101  # a request loads it
    add_tagged(tmp_path, "c", edition=3)  # a new folder, before b changes: every later rescan sees it
    (model_b / "1" / "model.py").write_text(tagged(4))
    wait_for(lambda: answers(client, "b", 104), 15.0, "the loaded model b to be reloaded with its new code")
    assert "loading 'c'" not in server.log()  # the rescans that reloaded b left c alone
    assert index(client).get(("c", "1"), {}).get("state") != "READY"
    shutil.rmtree(model_b)
    wait_for(lambda: ("b", "1") not in index(client), 15.0, "b to be unloaded once its folder is gone")
    assert ask(client, "c") == 103 and ask(client, "pinned") == 102

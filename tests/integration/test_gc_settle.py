"""runtime/gc_settle.py through the real server: after the models load, what is alive is frozen (the full
collections under traffic no longer walk it), and a model unloaded later still has its reference cycles
collected (each settle unfreezes first). With fast paths off CPython's collector is left as it is."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import tritonclient.http as httpclient

from triton_actor.runtime import fastpath

from .model_control import wait_for
from .server import IDENTITY_CONFIG, add_model

# an instance in a reference cycle (self.me = self), holding an object that writes a file when freed
CYCLIC_PY = """
import json
import triton_python_backend_utils as pb_utils


class Marker:
    def __init__(self, path):
        self.path = path

    def __del__(self):
        with open(self.path, "w") as f:
            f.write("freed")


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.marker = Marker(params["freed"]["string_value"])
        self.me = self  # a cycle: only the cyclic collector frees this instance

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def _gc(server) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:
        return json.loads(answer.read())["gc"][0]


def test_loaded_objects_are_frozen_and_an_unloaded_models_cycles_still_go(tmp_path: Path, start_server) -> None:
    freed = tmp_path / "freed"
    add_model(tmp_path / "repo", "cyclic", IDENTITY_CONFIG + f"""
parameters {{ key: "freed" value: {{ string_value: "{freed}" }} }}
""", CYCLIC_PY)
    server = start_server(tmp_path / "repo", flags=("--model-control-mode", "explicit", "--load-model", "cyclic"))
    status = _gc(server)
    if not fastpath.enabled:  # the specification: CPython's own collector, nothing frozen
        assert status["frozen"] == 0 and status["settles"] == 0
        return
    assert status["settles"] >= 1 and status["frozen"] > 50_000, status  # torch, onnxruntime, the model...
    client = httpclient.InferenceServerClient(server.url)
    client.unload_model("cyclic")
    wait_for(freed.exists, timeout=30, what="the unloaded model's cycle to be collected by the next settle")
    assert _gc(server)["settles"] > status["settles"]
    client.load_model("cyclic")  # and loads again as before
    assert client.is_model_ready("cyclic")
    client.close()

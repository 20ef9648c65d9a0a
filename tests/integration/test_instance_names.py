"""Instance group and instance names as Triton 2.51 gives them, seen by the model in
``initialize`` and by clients in ``/config`` (HTTP and gRPC) and the statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from triton_actor.backends.devices import gpu_count

from .clients import PROTOCOLS, Client
from .server import ServerProcess, add_model

# initialize() refuses to load unless Triton's name for this instance is one of the expected ones:
# a model that checks its own name must load (with --exit-on-error, the default, it stopped the server)
NAME_CHECK_PY = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        expected = config["parameters"]["expected"]["string_value"].split(",")
        self.name = args["model_instance_name"]
        if self.name not in expected:
            raise pb_utils.TritonModelException(f"instance name {self.name!r}, expected one of {expected}")
        with open(os.path.join(args["model_repository"], "names"), "a") as f:
            f.write(self.name + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("NAME", np.array([self.name.encode()], np.object_))])
                for r in requests]
"""

HEAD = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "NAME", data_type: TYPE_STRING, dims: [ 1 ] } ]
parameters { key: "expected" value: { string_value: "%s" } }
"""

# A python model without instance_group takes Triton's KIND_AUTO: on a GPU host one instance per GPU, all
# named "<model>_0" (the copies of an instance on several GPUs share its name)
GPUS = gpu_count()

# model → (instance_group lines, group names /config shows, instance names initialize sees)
CASES = {
    "no_groups": ("", ["no_groups"], ["no_groups_0"] * max(1, GPUS)),
    "one_group": ("instance_group [ { count: 2, kind: KIND_CPU } ]", ["one_group_0"], ["one_group_0_0", "one_group_0_1"]),
    "two_groups": ("instance_group [ { kind: KIND_CPU }, { kind: KIND_CPU } ]", ["two_groups_0", "two_groups_1"],
                   ["two_groups_0_0", "two_groups_1_0"]),
    "named": ('instance_group [ { name: "mine", kind: KIND_CPU } ]', ["mine"], ["mine_0"]),
}


@pytest.fixture(scope="module")
def names_server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("names")
    for model, (groups, _, instances) in CASES.items():
        add_model(repo, model, HEAD % ",".join(sorted(set(instances))) + groups, NAME_CHECK_PY)
    server = ServerProcess(repo)  # --exit-on-error is on: one refused name and the server is gone
    try:
        server.wait_ready()
        yield repo, server
    finally:
        server.stop()


def test_initialize_sees_triton_instance_names(names_server) -> None:
    repo, _ = names_server
    for model, (_, _, instances) in CASES.items():
        assert sorted((repo / model / "names").read_text().split()) == instances


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_config_and_statistics_show_triton_group_names(names_server, protocol: str) -> None:
    _, server = names_server
    client = Client(protocol, server)
    try:
        for model, (_, groups, instances) in CASES.items():
            cfg = client.get_model_config(model)
            assert [g["name"] for g in cfg["instance_group"]] == groups
            kind = "KIND_GPU" if GPUS and model == "no_groups" else "KIND_CPU"
            assert [g["kind"] for g in cfg["instance_group"]] == [kind] * len(groups)
            x = client.mod.InferInput("INPUT0", [1], "FP32")
            x.set_data_from_numpy(np.zeros(1, np.float32))
            name = client.infer(model, [x]).as_numpy("NAME")[0]
            assert name.decode() in instances
            stats = client.get_inference_statistics(model)["model_stats"]
            assert [(s["name"], s["version"]) for s in stats] == [(model, "1")]
            assert int(stats[0]["inference_count"]) >= 1
    finally:
        client.close()


def test_error_text_names_the_instance(tmp_path: Path, start_server) -> None:
    """Triton's python backend names the instance in execute errors ('<group>_<i>'; NOTES.md: exec_raise_0)."""
    raise_py = NAME_CHECK_PY.replace("        return [pb_utils.InferenceResponse(",
                                     "        raise ValueError('no')\n        return [pb_utils.InferenceResponse(")
    add_model(tmp_path, "boom", HEAD % "boom_0_0" + "instance_group [ { kind: KIND_CPU } ]", raise_py)
    server = start_server(tmp_path)
    client = Client("http", server)
    try:
        x = client.mod.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.zeros(1, np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("boom", [x])
        assert "Failed to process the request(s) for model 'boom_0_0', message: ValueError: no" in str(e.value)
    finally:
        client.close()

"""Loading, failing, versions, auto-complete, instances in parallel, and shutdown, on real servers."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .clients import PROTOCOLS, Client
from .server import IDENTITY_CONFIG, IDENTITY_PY, add_model, wait_for_fifo
from .test_examples import _post

BAD_INIT_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize failed on purpose")

    def execute(self, requests):
        return []
"""

EXEC_RAISE_PY = """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("execute failed on purpose")
"""


def _identity(client: httpclient.InferenceServerClient | Client, model: str, data: np.ndarray,
              **kw: object) -> np.ndarray:
    mod = client.mod if isinstance(client, Client) else httpclient
    i = mod.InferInput("INPUT0", list(data.shape), "FP32")
    i.set_data_from_numpy(data)
    return client.infer(model, [i], **kw).as_numpy("OUTPUT0")


def test_initialize_failure_exits_by_default(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, wait=False)
    assert server.wait_exit(60) == 1
    assert "bad_init" in server.log() and "initialize failed on purpose" in server.log()


def test_initialize_failure_leaves_others_serving(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: a model is not READY
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["good"]["state"] == "READY"
    bad = index["bad_init"]
    assert bad["state"] == "UNAVAILABLE" and bad["version"] == "1"
    assert bad["reason"].startswith("Internal: RuntimeError: initialize failed on purpose\n\nAt:\n")
    assert "model.py(6): initialize" in bad["reason"]
    np.testing.assert_array_equal(_identity(client, "good", np.arange(3, dtype=np.float32)), np.arange(3))
    with pytest.raises(InferenceServerException) as e:
        _identity(client, "bad_init", np.arange(3, dtype=np.float32))
    assert e.value.status() == "404" and "has no available versions" in e.value.message()
    assert not client.is_model_ready("bad_init")


def test_non_strict_readiness(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false", "--strict-readiness=false"))
    assert httpclient.InferenceServerClient(server.url).is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_execute_exception_is_a_clean_error(tmp_path: Path, start_server, protocol: str) -> None:
    add_model(tmp_path, "exec_raise", IDENTITY_CONFIG, EXEC_RAISE_PY)
    server = start_server(tmp_path)
    client = Client(protocol, server)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as e:
            _identity(client, "exec_raise", np.arange(4, dtype=np.float32))
        assert client.status(e.value) == client.expect("INTERNAL", 500)
        assert e.value.message().startswith(
            "Failed to process the request(s) for model 'exec_raise_0', message: "
            "ValueError: execute failed on purpose\n\nAt:\n")
    assert client.is_model_ready("exec_raise")
    stats = client.get_inference_statistics("exec_raise")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert stats["inference_count"] == 0 and stats["execution_count"] == 2


def test_invalid_configs_name_file_line_and_rule(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "typo", IDENTITY_CONFIG.replace("TYPE_FP32", "TYPE_FP99", 1), IDENTITY_PY)
    add_model(tmp_path, "unknown_field", IDENTITY_CONFIG + "\nno_such_field: 3\n", IDENTITY_PY)
    add_model(tmp_path, "bad_dims", IDENTITY_CONFIG.replace("dims: [ -1 ]", "dims: [ 0 ]", 1), IDENTITY_PY)
    add_model(tmp_path, "wrong_name", 'name: "other"\n' + IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "no_backend", IDENTITY_CONFIG.replace('backend: "python"', 'backend: "tensorflow"'), IDENTITY_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    index = {e["name"]: e for e in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert index["good"]["state"] == "READY"
    typo = index["typo"]["reason"]
    assert "typo" in typo and str(tmp_path / "typo" / "config.pbtxt") + ":4:" in typo and "TYPE_FP99" in typo
    assert "no_such_field" in index["unknown_field"]["reason"]
    assert ":7:1" in index["unknown_field"]["reason"]
    assert "dimension must be integer >= 1, or -1" in index["bad_dims"]["reason"]
    assert "unexpected directory name 'wrong_name' for model 'other'" in index["wrong_name"]["reason"]
    assert "unable to find backend library for backend 'tensorflow'" in index["no_backend"]["reason"]
    for name in ("typo", "unknown_field", "bad_dims", "wrong_name", "no_backend"):
        assert index[name]["state"] == "UNAVAILABLE"


VERSION_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.version = float(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                np.full(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape, self.version, np.float32))])
                for r in requests]
"""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_version_folders_and_policies(tmp_path: Path, start_server, protocol: str) -> None:
    cfg_all = IDENTITY_CONFIG + "\nversion_policy: { all: {} }\n"
    add_model(tmp_path, "all", cfg_all, VERSION_PY, versions=("0", "01", "2", "3abc", "warmup"))
    add_model(tmp_path, "latest", IDENTITY_CONFIG + "\nversion_policy: { latest: { num_versions: 2 } }\n",
              VERSION_PY, versions=("1", "2", "3"))
    add_model(tmp_path, "specific", IDENTITY_CONFIG + "\nversion_policy: { specific: { versions: [1, 3, 7] } }\n",
              VERSION_PY, versions=("1", "2", "3"))
    add_model(tmp_path, "default", IDENTITY_CONFIG, VERSION_PY, versions=("1", "10", "9"))
    server = start_server(tmp_path)
    client = Client(protocol, server)
    ready = {(e["name"], e["version"]) for e in client.get_model_repository_index() if e.get("state") == "READY"}
    assert ready == {("all", "0"), ("all", "2"), ("all", "3"), ("latest", "2"), ("latest", "3"),
                     ("specific", "1"), ("specific", "3"), ("default", "10")}
    x = np.zeros(2, dtype=np.float32)
    assert _identity(client, "all", x)[0] == 3  # no version in the URL: the highest ready one
    assert _identity(client, "all", x, model_version="0")[0] == 0
    assert _identity(client, "default", x)[0] == 10
    assert client.get_model_metadata("all")["versions"] == ["0", "2", "3"]
    with pytest.raises(InferenceServerException) as e:
        _identity(client, "latest", x, model_version="1")
    assert client.status(e.value) == client.expect("NOT_FOUND", 404)


AUTO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]})
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
                for r in requests]
"""


def test_auto_complete_config(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "auto", None, AUTO_PY)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    cfg = client.get_model_config("auto")
    assert cfg["backend"] == "python" and cfg["max_batch_size"] == 4
    assert cfg["input"][0]["dims"] == [2] and "dynamic_batching" in cfg
    np.testing.assert_array_equal(_identity(client, "auto", np.ones((1, 2), np.float32)), [[2, 2]])


def test_disable_auto_complete(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "auto", None, AUTO_PY)
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--disable-auto-complete-config", "--exit-on-error=false"))
    index = {e["name"]: e for e in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert index["good"]["state"] == "READY"
    assert index["auto"]["state"] == "UNAVAILABLE" and "config.pbtxt" in index["auto"]["reason"]


ARGS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from .helper import SUFFIX

class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        out = []
        for r in requests:
            info = dict(self.args, suffix=SUFFIX, request_id=r.request_id(), parameters=r.parameters(),
                        requested=r.requested_output_names(), correlation_id=r.correlation_id())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([json.dumps(info).encode()], dtype=np.object_))]))
        return out
"""
ARGS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "greeting" value: { string_value: "hi" } }
"""


def test_initialize_args_relative_import_and_request_accessors(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "args", ARGS_CONFIG, ARGS_PY, files={"1/helper.py": "SUFFIX = 'from helper'\n"})
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    i = httpclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.zeros(1, np.float32))
    result = client.infer("args", [i], request_id="abc", parameters={"color": "blue", "n": 3},
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    info = json.loads(result.as_numpy("OUTPUT0")[0])
    assert info["model_name"] == "args" and info["model_version"] == "1"
    assert info["model_repository"] == str(model_dir)
    assert info["model_instance_kind"] == "CPU" and info["model_instance_device_id"] == "0"
    assert info["model_instance_name"] in ("args_0_0", "args_0_1")
    config = json.loads(info["model_config"])
    assert config["parameters"] == {"greeting": {"string_value": "hi"}}
    assert config["instance_group"][0]["count"] == 2
    assert info["suffix"] == "from helper"
    assert info["request_id"] == "abc" and json.loads(info["parameters"]) == {"color": "blue", "n": 3}
    assert info["requested"] == ["OUTPUT0"] and info["correlation_id"] == 0


SLOW_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        start = time.time()
        fifo = os.path.join(os.path.dirname(self.marker), "started.fifo")
        if os.path.exists(fifo):  # tell a waiting test that a request is inside execute
            with open(fifo, "w") as f:
                f.write("started\\n")
        time.sleep(0.5)  # model code: the work that takes time
        end = time.time()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([start, end], np.float64)),
                                            pb_utils.Tensor("NAME", np.array([self.name.encode()], np.object_))])
                for r in requests]

    def finalize(self):
        with open(self.marker, "a") as f:
            f.write(self.name + "\\n")
"""
SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP64, dims: [ 2 ] }, { name: "NAME", data_type: TYPE_STRING, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def _slow_call(url: str, model: str, out: list) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    i = httpclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.zeros(1, np.float32))
    r = client.infer(model, [i])
    out.append((r.as_numpy("OUTPUT0"), r.as_numpy("NAME")[0]))


def test_instances_and_models_run_in_parallel(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "slow_a", SLOW_CONFIG, SLOW_PY)
    add_model(tmp_path, "slow_b", SLOW_CONFIG.replace("count: 2", "count: 1"), SLOW_PY)
    server = start_server(tmp_path)
    results: list = []
    threads = [threading.Thread(target=_slow_call, args=(server.url, m, results)) for m in ("slow_a", "slow_a", "slow_b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3
    names = sorted(r[1] for r in results)
    assert names == [b"slow_a_0_0", b"slow_a_0_1", b"slow_b_0_0"]  # Triton 2.51: always "<group>_<i>"
    latest_start = max(r[0][0] for r in results)
    earliest_end = min(r[0][1] for r in results)
    assert latest_start < earliest_end, "the three executions did not overlap in time"


def test_sigterm_finishes_in_flight_and_finalizes(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "slow", SLOW_CONFIG, SLOW_PY)
    fifo = model_dir / "started.fifo"
    os.mkfifo(fifo)
    server = start_server(tmp_path)
    results: list = []
    caller = threading.Thread(target=_slow_call, args=(server.url, "slow", results))
    caller.start()
    wait_for_fifo(fifo, server)
    server.proc.send_signal(signal.SIGTERM)
    caller.join(60)
    assert server.wait_exit(60) == 0
    assert len(results) == 1, server.log()  # the in-flight request was answered
    finalized = (model_dir / "finalized").read_text().split()
    assert sorted(finalized) == ["slow_0_0", "slow_0_1"]


def test_body_size_limit(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "ident", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--http-max-input-size", "1000"))
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [400], "datatype": "FP32", "data": [0.5] * 400}]}).encode()
    status, _, data = _post(server, "/v2/models/ident/infer", body)
    assert status == 400 and "exceeds the maximum allowed input size of 1000 bytes" in json.loads(data)["error"]
    small = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, _, _ = _post(server, "/v2/models/ident/infer", small)
    assert status == 200


DECOUPLED_CONFIG = IDENTITY_CONFIG + "\nmodel_transaction_policy { decoupled: true }\n"


def test_decoupled_model_on_http_infer_is_501(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "dec", DECOUPLED_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, _, data = _post(server, "/v2/models/dec/infer", body)
    assert (status, json.loads(data)) == (
        501, {"error": "HTTP end point doesn't support models with decoupled transaction policy"})


def test_failed_load_is_logged_without_greenlet_traceback(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    assert "failed to load 'bad_init' version 1" in server.log()
    assert "Greenlet" not in server.log()


SPAWNING_PY = """
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        # model code may spawn processes (twice: the second capture_output call used to hang)
        outs = [subprocess.run([sys.executable, "-c", "print(21)"], capture_output=True, text=True).stdout
                for _ in range(2)]
        self.value = float(sum(int(o) for o in outs))
        self.pool = ThreadPoolExecutor(2)

    def execute(self, requests):
        def one(r):
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + self.value)])
        return list(self.pool.map(one, requests))
"""


def test_model_code_may_spawn_processes_and_use_thread_pools(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "spawning", IDENTITY_CONFIG, SPAWNING_PY)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    for _ in range(40):  # enough to be promoted to inline execution too
        np.testing.assert_array_equal(_identity(client, "spawning", np.zeros(2, np.float32)), [42, 42])


PARAMS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for i, r in enumerate(requests):
            t = pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())
            as_json = r.request_id() == "json"
            params = '{"source": "json", "n": 2}' if as_json else {"source": "dict", "flag": True}
            out.append(pb_utils.InferenceResponse([t], parameters=params))
        return out
"""


def test_response_parameters_reach_the_client(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "params", IDENTITY_CONFIG, PARAMS_PY)
    server = start_server(tmp_path)
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
    for rid, want in (("dict", {"source": "dict", "flag": True}), ("json", {"source": "json", "n": 2})):
        status, _, data = _post(server, "/v2/models/params/infer", json.dumps({**body, "id": rid}).encode())
        assert status == 200 and json.loads(data)["parameters"] == want
    client = Client("grpc", server)
    for rid, want in (("dict", {"source": "dict", "flag": True}), ("json", {"source": "json", "n": 2})):
        result = client.infer("params", [client.input("INPUT0", np.ones(1, np.float32), "FP32")], request_id=rid)
        params = result.get_response().parameters
        assert {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in params.items()} == want

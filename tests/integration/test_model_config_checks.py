"""Config checks at load, with Triton's texts, and the auto-completed ensemble config, through tritonclient.

The repositories and the expected texts come from Triton's ``qa/L0_model_config`` (triton-inference-
server/server, Copyright (c) 2019-2025 NVIDIA CORPORATION & AFFILIATES, BSD-3-Clause: redistribution
with this notice; the suite's license text is in that repository's LICENSE file), trimmed to what each
check looks at; its ``identity``/``repeat`` composing models are Python models here. Real Triton 2.51
answers each case with the same text (scripts/triton_reference/l0_model_config.py runs the whole suite
on both servers).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.utils import InferenceServerException

from .server import add_model

STUB_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
NO_RETURN_PY = STUB_PY + "\n    @staticmethod\n    def auto_complete_config(auto_complete_model_config):\n        pass\n"


def _io(kind: str, name: str, dtype: str = "TYPE_FP32", dims: str = "16") -> str:
    return f'{kind} [ {{ name: "{name}", data_type: {dtype}, dims: [ {dims} ] }} ]'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def _ensemble(name: str, mbs: int, steps: list[str], extra: str = "", io: str = "") -> str:
    io = io or _io("input", "data") + "\n" + _io("output", "prob")
    return (f'name: "{name}"\nmax_batch_size: {mbs}\nplatform: "ensemble"\n'
            f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n{io}\n{extra}')


def _composing(name: str, mbs: int, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]],
               dtype: str = "TYPE_FP32", decoupled: bool = False) -> str:
    tensors = [_io("input", n, dtype, d) for n, d in inputs] + [_io("output", n, dtype, d) for n, d in outputs]
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: {mbs}\n' + "\n".join(tensors) + f"\n{policy}"


# composing models shared by the cases (names from the suite)
COMPOSING = {
    "fp32_dim1_batch4": _composing("fp32_dim1_batch4", 4, [("INPUT0", "16")], [("OUTPUT0", "16")]),
    "fp32_dim2_nobatch": _composing("fp32_dim2_nobatch", 0, [("INPUT0", "-1, 16")], [("OUTPUT0", "-1, 16")]),
    "fp32_dim1_batch4_output3": _composing("fp32_dim1_batch4_output3", 4, [("INPUT0", "16"), ("INPUT1", "16"), ("INPUT2", "16")],
                                           [("OUTPUT0", "16"), ("OUTPUT1", "16"), ("OUTPUT2", "16")]),
    "repeat_int32": _composing("repeat_int32", 0, [("IN", "-1")], [("OUT", "1"), ("IDX", "1")], "TYPE_INT32", True),
    "int32_dim1_nobatch_output2": _composing("int32_dim1_nobatch_output2", 0, [("INPUT0", "1"), ("INPUT1", "1")],
                                             [("OUTPUT0", "1"), ("OUTPUT1", "1")], "TYPE_INT32"),
}
REPEAT = {"IN": "IN"}
INT_IO = _io("input", "IN", "TYPE_INT32", "-1") + "\n" + _io("output", "OUT", "TYPE_INT32", "1")

# (folder, config, expected text): each is refused at load, with Triton's text
REFUSED = [
    ("ensemble_scheduling_no_set",
     'name: "ensemble_scheduling_not_set"\nmax_batch_size: 8\nplatform: "ensemble"\n' + _io("input", "data") + _io("output", "prob"),
     "ensemble scheduling must be set for ensemble ensemble_scheduling_not_set whose platform is ensemble"),
    ("has_backend",
     'name: "has_backend"\nmax_batch_size: 8\nbackend: "onnxruntime"\nplatform: "ensemble"\n' + _io("input", "data"),
     "Ensemble model 'has_backend' must have platform type 'ensemble' and empty backend type"),
    ("instance_group_set",
     _ensemble("instance_group_set", 4, [_step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "prob"})],
               "instance_group [ { kind: KIND_GPU, count: 1 } ]"),
     "instance group should not be specified for ensemble 'instance_group_set'"),
    ("model_warm_up_set",
     _ensemble("model_warmup_set", 4, [_step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "prob"})],
               'model_warmup [ { name: "w" batch_size: 1 inputs { key: "data" value { data_type: TYPE_FP32 '
               'dims: [ 16 ] zero_data: true } } } ]'),
     "model_warmup can not be specified for ensemble 'model_warmup_set'"),
    ("unreachable_output_3",
     _ensemble("unreachable_output_3", 2, [
         _step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "prob"}),
         _step("fp32_dim1_batch4", {"INPUT0": "not_written_tensor"}, {"OUTPUT0": "prob_2"})],
         io=_io("input", "data") + "\n" + "output [ { name: \"prob\", data_type: TYPE_FP32, dims: [ 16 ] }, "
                                          "{ name: \"prob_2\", data_type: TYPE_FP32, dims: [ 16 ] } ]"),
     "output 'prob_2' for ensemble 'unreachable_output_3' is not written: at least one of its depending tensors, "
     "'not_written_tensor', is not connected"),
    ("invalid_decoupled_branching",
     _ensemble("invalid_decoupled_branching", 0, [
         _step("repeat_int32", REPEAT, {"OUT": "repeat_1_out"}),
         _step("repeat_int32", REPEAT, {"OUT": "repeat_2_out"}),
         _step("int32_dim1_nobatch_output2", {"INPUT0": "repeat_1_out", "INPUT1": "repeat_2_out"},
               {"OUTPUT0": "identity_0", "OUTPUT1": "identity_1"}),
         _step("int32_dim1_nobatch_output2", {"INPUT0": "identity_0", "INPUT1": "identity_1"}, {"OUTPUT0": "OUT"})],
         io=INT_IO),
     "in ensemble invalid_decoupled_branching, step of model 'int32_dim1_nobatch_output2' receives inputs "
     "originated from different decoupled models"),
    ("invalid_decoupled_branching_2",
     _ensemble("invalid_decoupled_branching_2", 0, [
         _step("repeat_int32", REPEAT, {"OUT": "OUT"}),
         _step("repeat_int32", REPEAT, {"OUT": "OUT_2"})],
         io=_io("input", "IN", "TYPE_INT32", "-1") + "\noutput [ { name: \"OUT\", data_type: TYPE_INT32, dims: [ 1 ] }, "
                                                    "{ name: \"OUT_2\", data_type: TYPE_INT32, dims: [ 1 ] } ]"),
     "in ensemble invalid_decoupled_branching_2, step of model 'invalid_decoupled_branching_2' receives inputs "
     "originated from different decoupled models"),
    ("no_version", 'name: "no_version"\nmax_batch_size: 1\n' + _io("input", "input") + _io("output", "output"),
     "Invalid model name: Could not determine backend for model 'no_version' with no backend in model "
     "configuration. Expected model name of the form 'model.<backend_name>'."),
    ("unknown_backend.unknown", 'name: "unknown_backend.unknown"\nmax_batch_size: 1\n' + _io("input", "input"),
     "unable to find backend library for backend 'unknown', try specifying runtime on the model configuration."),
    ("no_return", "", "auto_complete_config function in model 'no_return' must return a valid pb.ModelConfig object."),
]

# (ensemble, its config): loads, and /config is the file's content as Triton completes it (the suite's expected files)
LOADED = {
    "inconsistent_shape": _ensemble("inconsistent_shape", 2, [
        _step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "temp_tensor"}),
        _step("fp32_dim2_nobatch", {"INPUT0": "temp_tensor"}, {"OUTPUT0": "prob"})]),
    "inconsistent_shape_2": _ensemble("inconsistent_shape_2", 0, [
        _step("fp32_dim2_nobatch", {"INPUT0": "data"}, {"OUTPUT0": "temp_tensor"}),
        _step("fp32_dim1_batch4", {"INPUT0": "temp_tensor"}, {"OUTPUT0": "prob"})],
        io=_io("input", "data", dims="4, 16") + "\n" + _io("output", "prob", dims="4, 16")),
    "unmapped_output": _ensemble("unmapped_output", 2, [
        _step("fp32_dim1_batch4_output3", {"INPUT0": "data", "INPUT1": "data", "INPUT2": "data"}, {"OUTPUT0": "prob"})]),
    "inner_ensemble": _ensemble("inner_ensemble", 2, [_step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "prob"})]),
    "embedded_ensemble": _ensemble("embedded_ensemble", 2, [_step("inner_ensemble", {"data": "data"}, {"prob": "prob"})]),
    # the file's decoupled: true is overwritten from the steps, as Triton does
    "says_decoupled": _ensemble("says_decoupled", 2, [_step("fp32_dim1_batch4", {"INPUT0": "data"}, {"OUTPUT0": "prob"})],
                                "model_transaction_policy { decoupled: true }"),
    "streams": _ensemble("streams", 0, [_step("repeat_int32", REPEAT, {"OUT": "OUT"})], io=INT_IO),
}


def _repository(repo: Path) -> None:
    for name, config in COMPOSING.items():
        add_model(repo, name, config, STUB_PY)
    for folder, config, _ in REFUSED:
        if folder == "no_return":
            add_model(repo, folder, None, NO_RETURN_PY)
        elif folder == "no_version":
            (repo / folder).mkdir()
            (repo / folder / "config.pbtxt").write_text(config)
        else:
            (repo / folder / "1").mkdir(parents=True)
            (repo / folder / "config.pbtxt").write_text(config)
    for name, config in LOADED.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from .server import ServerProcess

    repo = tmp_path_factory.mktemp("repo")
    _repository(repo)
    proc = ServerProcess(repo, flags=("--model-control-mode=explicit", "--strict-model-config=false")).wait_ready()
    yield proc
    proc.stop()


def _refusal(call, *args, **kw) -> str:
    with pytest.raises(InferenceServerException) as e:
        call(*args, **kw)
    return e.value.message()


@pytest.mark.parametrize(("folder", "expected"), [(f, e) for f, _, e in REFUSED], ids=[f for f, _, _ in REFUSED])
def test_refused_at_load_with_tritons_text(server, folder: str, expected: str) -> None:
    for client in (httpclient.InferenceServerClient(server.url), grpcclient.InferenceServerClient(server.grpc_url)):
        assert expected in _refusal(client.load_model, folder)


def _poll_failed(name: str) -> str:
    return f"failed to load '{name}', failed to poll from model repository"


# (folder, HTTP status, gRPC code, message): the load API's answer as Triton 2.51 gives it, by the stage of
# its load the refusal comes from (measured with scripts/triton_reference/l0_model_config.py --load-api):
# the config alone fails the poll (Triton only logs the reason; ours keeps it after the text), an ensemble
# against its steps fails the model, the backend fails each version
LOAD_API = [
    ("has_backend", 500, "StatusCode.INTERNAL", _poll_failed("has_backend") + ": Ensemble model 'has_backend' must "
     "have platform type 'ensemble' and empty backend type"),
    ("no_version", 500, "StatusCode.INTERNAL", _poll_failed("no_version") + ": " + REFUSED[7][2]),
    ("invalid_decoupled_branching", 400, "StatusCode.INVALID_ARGUMENT",
     f"load failed for model 'invalid_decoupled_branching': {REFUSED[5][2]}\n"),
    ("unknown_backend.unknown", 400, "StatusCode.INVALID_ARGUMENT", "load failed for model 'unknown_backend.unknown': "
     f"version 1 is at UNAVAILABLE state: Invalid argument: {REFUSED[8][2]};\n"),
    ("no_return", 400, "StatusCode.INVALID_ARGUMENT",
     f"load failed for model 'no_return': version 1 is at UNAVAILABLE state: Internal: {REFUSED[9][2]};\n"),
]


@pytest.mark.parametrize(("folder", "status", "code", "message"), LOAD_API, ids=[c[0] for c in LOAD_API])
def test_the_load_api_words_a_refusal_as_triton_does(server, folder: str, status: int, code: str, message: str) -> None:
    request = urllib.request.Request(f"http://{server.url}/v2/repository/models/{folder}/load", data=b"{}",
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(request, timeout=60)
    assert http_error.value.code == status
    assert json.loads(http_error.value.read())["error"] == message
    assert _refusal(httpclient.InferenceServerClient(server.url).load_model, folder) == message
    with pytest.raises(InferenceServerException) as grpc_error:
        grpcclient.InferenceServerClient(server.grpc_url).load_model(folder)
    assert (grpc_error.value.status(), grpc_error.value.message()) == (code, message)


def test_refused_through_a_config_override(server) -> None:
    """The load API's ``config`` runs the same checks as a file."""
    client = httpclient.InferenceServerClient(server.url)
    base = text_format.Parse(LOADED["inconsistent_shape"], mc.ModelConfig())
    overrides = {
        "instance group should not be specified for ensemble 'inconsistent_shape'": {
            "instance_group": [{"kind": "KIND_CPU"}]},
        "Ensemble model 'inconsistent_shape' must have platform type 'ensemble' and empty backend type": {
            "backend": "python"},
        "ensemble scheduling must be set for ensemble inconsistent_shape whose platform is ensemble": {
            "ensemble_scheduling": None},
    }
    for expected, change in overrides.items():
        cfg = json.loads(json_format.MessageToJson(base, preserving_proto_field_name=True))
        cfg.update({k: v for k, v in change.items() if v is not None})
        for k in [k for k, v in change.items() if v is None]:
            cfg.pop(k)
        assert expected in _refusal(client.load_model, "inconsistent_shape", config=json.dumps(cfg))


def _expected(name: str, decoupled: bool = False) -> mc.ModelConfig:
    """Triton's completed ensemble config: the file, a latest-1 version policy, and the transaction
    policy taken from the steps; no instance group, no optimization."""
    cfg = text_format.Parse(LOADED[name], mc.ModelConfig())
    cfg.version_policy.latest.num_versions = 1
    cfg.model_transaction_policy.decoupled = decoupled
    return cfg


@pytest.mark.parametrize("name", ["inconsistent_shape", "inconsistent_shape_2", "unmapped_output", "embedded_ensemble",
                                  "says_decoupled", "streams"])
def test_completed_ensemble_config_is_tritons(server, name: str) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http.load_model(name)
    want = _expected(name, decoupled=name == "streams")
    got = grpc.get_model_config(name).config
    assert got == want
    assert got.HasField("model_transaction_policy")  # Triton sets it, to false too
    got_http = http.get_model_config(name)
    assert got_http["model_transaction_policy"] == {"decoupled": name == "streams"}
    assert "instance_group" not in got_http or got_http["instance_group"] == []
    assert "optimization" not in got_http
    assert [i["dims"] for i in got_http["input"]] == [list(i.dims) for i in want.input]  # the file's, not inferred


def test_refused_at_startup_with_tritons_log_line(tmp_path: Path, start_server) -> None:
    """Triton's suite greps its log for an ``E`` line with the text (``Invalid argument: ...``)."""
    folder, config, expected = REFUSED[1]
    (tmp_path / folder / "1").mkdir(parents=True)
    (tmp_path / folder / "config.pbtxt").write_text(config)
    server = start_server(tmp_path, wait=False)
    assert server.wait_exit(60) != 0
    assert any(line.startswith("E") and f"Invalid argument: {expected}" in line for line in server.log().splitlines())

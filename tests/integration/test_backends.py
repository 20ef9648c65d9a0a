"""ONNX Runtime and TorchScript models through the real server, compared with the same model in-process."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import modelgen
from triton_actor.backends.devices import gpu_count

from .server import IDENTITY_CONFIG, IDENTITY_PY, add_model

ort = pytest.importorskip("onnxruntime")
DIMS = (256, 1024, 16)
BIG = (2048, 4096, 16)


def _infer(client: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray], **kw: object):
    tensors = []
    for name, array in inputs.items():
        dtype = "BYTES" if array.dtype == object else {np.dtype(np.float32): "FP32"}.get(array.dtype)
        if dtype is None:
            from tritonclient.utils import np_to_triton_dtype

            dtype = np_to_triton_dtype(array.dtype)
        t = httpclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    return client.infer(model, tensors, **kw)


def _in_process(model_file: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def onnx_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("onnx_repo")
    modelgen.onnx_mlp(repo, "mlp", dims=DIMS, max_batch_size=32)
    # ~32 MB of weights: one request's compute is memory-bound (~1 ms), so concurrent requests queue
    modelgen.onnx_mlp(repo, "mlp_big", dims=BIG, max_batch_size=32)
    modelgen.onnx_mlp(repo, "mlp_auto", dims=(8, 4, 3), config=False)
    modelgen.onnx_classifier(repo, "classifier")
    modelgen.onnx_all_types(repo, "types")
    return repo


@pytest.fixture(scope="module")
def onnx_server(onnx_repo: Path):
    from .server import ServerProcess

    server = ServerProcess(onnx_repo).wait_ready()
    yield server
    server.stop()


@pytest.fixture
def onnx_client(onnx_server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(onnx_server.url, concurrency=32)


@pytest.mark.parametrize("batch", [1, 5])
def test_onnx_mlp_matches_in_process(onnx_repo: Path, onnx_client, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, DIMS[0])).astype(np.float32)
    got = _infer(onnx_client, "mlp", {"INPUT0": x}).as_numpy("OUTPUT0")
    (want,) = _in_process(onnx_repo / "mlp" / "1" / "model.onnx", {"INPUT0": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, modelgen.mlp_reference(x, DIMS), rtol=1e-4, atol=1e-5)


def test_onnx_auto_complete(onnx_client) -> None:
    cfg = onnx_client.get_model_config("mlp_auto")
    assert cfg["platform"] == "onnxruntime_onnx" and cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 4  # Triton's default-max-batch-size for a batchable model
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [("INPUT0", "TYPE_FP32", [8])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [("OUTPUT0", "TYPE_FP32", [3])]
    assert "dynamic_batching" in cfg
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU" and cfg["instance_group"][0]["count"] == 2
    meta = onnx_client.get_model_metadata("mlp_auto")
    assert meta["platform"] == "onnxruntime_onnx" and meta["inputs"][0]["shape"] == [-1, 8]


def test_dynamic_batching_forms_batches(onnx_server, onnx_client) -> None:
    before = onnx_client.get_inference_statistics("mlp_big")["model_stats"][0]
    x = np.random.default_rng(0).standard_normal((1, BIG[0])).astype(np.float32)

    def three_requests(_: int) -> list[np.ndarray]:
        client = httpclient.InferenceServerClient(onnx_server.url)  # one connection per caller
        t = httpclient.InferInput("INPUT0", [1, BIG[0]], "FP32")
        t.set_data_from_numpy(x)
        return [client.infer("mlp_big", [t]).as_numpy("OUTPUT0") for _ in range(3)]

    with ThreadPoolExecutor(16) as pool:  # greenlets in this patched process: 16 concurrent callers
        results = [r for rs in pool.map(three_requests, range(16)) for r in rs]
    for r in results:
        np.testing.assert_allclose(r, modelgen.mlp_reference(x, BIG), rtol=1e-4, atol=1e-4)
    after = onnx_client.get_inference_statistics("mlp_big")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 48
    assert executions < inferences, "48 concurrent requests on one instance were never batched"
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


def test_classifier_with_labels(onnx_repo: Path, onnx_client) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    out = httpclient.InferRequestedOutput("PROBABILITIES", class_count=3)
    got = _infer(onnx_client, "classifier", {"IMAGE": x}, outputs=[out]).as_numpy("PROBABILITIES")
    (probs,) = _in_process(onnx_repo / "classifier" / "1" / "model.onnx", {"IMAGE": x})
    labels = (onnx_repo / "classifier" / "labels.txt").read_text().split()
    assert got.shape == (2, 3)
    for row, want in zip(got, probs, strict=True):
        top = np.argsort(-want)[:3]
        assert [s.decode() if isinstance(s, bytes) else s for s in row] == [
            f"{want[i]:.6f}:{i}:{labels[i]}" for i in top
        ]


def test_all_types_round_trip(onnx_repo: Path, onnx_client) -> None:
    cfg = onnx_client.get_model_config("types")
    inputs: dict[str, np.ndarray] = {}
    for entry in cfg["input"]:
        triton_type = entry["data_type"].removeprefix("TYPE_")
        if triton_type == "STRING":
            inputs[entry["name"]] = np.array([[b"a", "é".encode()]], dtype=object)
        elif triton_type == "BOOL":
            inputs[entry["name"]] = np.array([[True, False]])
        else:
            from tritonclient.utils import triton_to_np_dtype

            inputs[entry["name"]] = np.array([[1, 2]], dtype=triton_to_np_dtype(triton_type))
    assert len(inputs) >= 8
    result = _infer(onnx_client, "types", inputs)
    for name, array in inputs.items():
        out = result.as_numpy(name.replace("IN_", "OUT_"))
        if array.dtype == object:
            assert [x if isinstance(x, bytes) else x.encode() for x in out.reshape(-1)] == list(array.reshape(-1))
        else:
            np.testing.assert_array_equal(out, array)
            assert out.dtype == array.dtype


def test_request_mismatches_caught_before_the_session(onnx_client) -> None:
    with pytest.raises(InferenceServerException) as e:
        _infer(onnx_client, "mlp", {"INPUT0": np.zeros((1, 255), np.float32)})
    assert e.value.status() == "400" and "unexpected shape for input 'INPUT0' for model 'mlp'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _infer(onnx_client, "mlp", {"INPUT0": np.zeros((1, DIMS[0]), np.float64)})
    assert "data-type is 'FP64', but model 'mlp' expects 'FP32'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _infer(onnx_client, "mlp", {"INPUT0": np.zeros((33, DIMS[0]), np.float32)})
    assert "batch-size must be <= 32" in e.value.message()


def test_bad_models_fail_alone(tmp_path: Path, start_server) -> None:
    good = modelgen.onnx_mlp(tmp_path, "good", dims=(8, 4, 3))
    modelgen.onnx_mlp(tmp_path, "truncated", dims=(8, 4, 3))
    modelgen.corrupt_copy(good / "1" / "model.onnx", tmp_path / "truncated" / "1" / "model.onnx", 40)
    modelgen.onnx_mlp(tmp_path, "wrong_type", dims=(8, 4, 3))
    cfg = tmp_path / "wrong_type" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("TYPE_FP32", "TYPE_INT32", 1))
    modelgen.onnx_mlp(tmp_path, "wrong_name", dims=(8, 4, 3))
    cfg = tmp_path / "wrong_name" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('"INPUT0"', '"IMAGE"', 1))
    modelgen.onnx_mlp(tmp_path, "wrong_dims", dims=(8, 4, 3))
    cfg = tmp_path / "wrong_dims" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("dims: [ 8 ]", "dims: [ 9 ]", 1).replace("dims: [8]", "dims: [9]", 1))
    add_model(tmp_path, "python_ok", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    client = httpclient.InferenceServerClient(server.url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["good"]["state"] == "READY" and index["python_ok"]["state"] == "READY"
    assert index["truncated"]["state"] == "UNAVAILABLE"
    assert "failed to load ONNX model" in index["truncated"]["reason"]
    assert "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32" in (
        index["wrong_type"]["reason"])
    assert "unexpected inference input 'IMAGE', allowed inputs are: INPUT0" in index["wrong_name"]["reason"]
    assert "the model has shape [-1, 8] but the configuration specifies [-1, 9]" in index["wrong_dims"]["reason"]
    x = np.ones((1, 8), np.float32)
    np.testing.assert_allclose(_infer(client, "good", {"INPUT0": x}).as_numpy("OUTPUT0"),
                               modelgen.mlp_reference(x, (8, 4, 3)), rtol=1e-4, atol=1e-5)


def test_disable_auto_complete_needs_a_config(tmp_path: Path, start_server) -> None:
    modelgen.onnx_mlp(tmp_path, "noconfig", dims=(8, 4, 3), config=False)
    add_model(tmp_path, "python_ok", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false", "--disable-auto-complete-config"))
    index = {e["name"]: e for e in httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert index["noconfig"]["state"] == "UNAVAILABLE" and "config.pbtxt" in index["noconfig"]["reason"]


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch")
    from .server import ServerProcess

    repo = tmp_path_factory.mktemp("torch_repo")
    modelgen.torchscript_mlp(repo, "mlp_ts", dims=DIMS, max_batch_size=32)
    batched = modelgen.torchscript_mlp(repo, "mlp_ts_batched", dims=DIMS, max_batch_size=32, dynamic_batching=True)
    config = batched / "config.pbtxt"  # a long delay: concurrent requests surely meet in one batch
    config.write_text(config.read_text().replace(
        "dynamic_batching { }", "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000000 }"))
    modelgen.onnx_mlp(repo, "mlp_onnx", dims=DIMS, max_batch_size=32)
    modelgen.torchscript_two_inputs(repo, "add_sub_ts")
    modelgen.torchscript_named_inputs(repo, "named_ts")
    server = ServerProcess(repo).wait_ready()
    yield server
    server.stop()


def test_torchscript_mlp_equals_onnx(torch_server) -> None:
    client = httpclient.InferenceServerClient(torch_server.url)
    x = np.random.default_rng(7).standard_normal((3, DIMS[0])).astype(np.float32)
    ts = _infer(client, "mlp_ts", {"INPUT__0": x}).as_numpy("OUTPUT__0")
    onnx = _infer(client, "mlp_onnx", {"INPUT0": x}).as_numpy("OUTPUT0")
    np.testing.assert_allclose(ts, onnx, rtol=1e-4, atol=1e-5)
    assert client.get_model_metadata("mlp_ts")["platform"] == "pytorch_libtorch"


def test_torchscript_dynamic_batching(torch_server) -> None:
    """Eight concurrent requests of different rows: one execution of batch 8, each caller gets its own rows."""
    client = httpclient.InferenceServerClient(torch_server.url)
    xs = [np.random.default_rng(i).standard_normal((1, DIMS[0])).astype(np.float32) for i in range(8)]
    calls = [gevent.spawn(lambda x: _infer(httpclient.InferenceServerClient(torch_server.url), "mlp_ts_batched",
                                           {"INPUT__0": x}).as_numpy("OUTPUT__0"), x) for x in xs]
    gevent.joinall(calls, timeout=60, raise_error=True)
    for x, call in zip(xs, calls, strict=True):
        np.testing.assert_allclose(call.value, modelgen.mlp_reference(x, DIMS), rtol=1e-4, atol=1e-5)
    stats = client.get_inference_statistics("mlp_ts_batched")["model_stats"][0]
    assert stats["inference_count"] == 8 and stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [8]


def test_torchscript_input_binding(torch_server) -> None:
    client = httpclient.InferenceServerClient(torch_server.url)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    r = _infer(client, "add_sub_ts", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), a - b)
    cfg = client.get_model_config("named_ts")
    names = [i["name"] for i in cfg["input"]]
    inputs = {names[0]: a, names[1]: b}  # config lists forward()'s arguments in reverse order
    out = _infer(client, "named_ts", inputs)
    outputs = [o["name"] for o in cfg["output"]]
    forward = dict(sorted(inputs.items()))  # forward(x, y): bound by name, not by config position
    x, y = forward.values()
    np.testing.assert_array_equal(out.as_numpy(outputs[0]), x + y)
    np.testing.assert_array_equal(out.as_numpy(outputs[1]), x - y)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="no GPU on this host")
def test_onnx_on_gpu(tmp_path: Path, start_server) -> None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime without CUDA (install the onnx-gpu extra)")
    model = modelgen.onnx_mlp(tmp_path, "mlp_gpu", dims=DIMS)
    cfg = model / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("KIND_CPU", "KIND_GPU"))
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    x = np.ones((2, DIMS[0]), np.float32)
    np.testing.assert_allclose(_infer(client, "mlp_gpu", {"INPUT0": x}).as_numpy("OUTPUT0"),
                               modelgen.mlp_reference(x, DIMS), rtol=1e-3, atol=1e-3)
    assert json.loads(json.dumps(client.get_model_config("mlp_gpu")))["instance_group"][0]["kind"] == "KIND_GPU"


@pytest.fixture
def cuda_torch():
    """torch with a CUDA device (the gpu-marked tests' own skip where there is none)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="no GPU on this host")
def test_torchscript_on_gpu(tmp_path: Path, start_server, cuda_torch) -> None:
    model = modelgen.torchscript_mlp(tmp_path, "mlp_ts_gpu", dims=DIMS, max_batch_size=8)
    cfg = model / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("KIND_CPU", "KIND_GPU"))
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    x = np.random.default_rng(0).standard_normal((4, DIMS[0])).astype(np.float32)
    np.testing.assert_allclose(_infer(client, "mlp_ts_gpu", {"INPUT__0": x}).as_numpy("OUTPUT__0"),
                               modelgen.mlp_reference(x, DIMS), rtol=1e-3, atol=1e-3)
    assert client.get_model_config("mlp_ts_gpu")["instance_group"][0]["kind"] == "KIND_GPU"


# a KIND_GPU Python model as Triton's GPU examples write one: its input to the device through DLPack, and
# its outputs given back as CUDA tensors (a capsule, and the tensor itself)
PYTHON_GPU_PY = """
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = torch.utils.dlpack.from_dlpack(pb_utils.get_input_tensor_by_name(r, "INPUT0").to_dlpack()).to("cuda")
            y = x * 2
            assert y.is_cuda
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(y)),
                pb_utils.Tensor.from_dlpack("OUTPUT1", y + 1)]))
        return out
"""


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="no GPU on this host")
def test_python_model_on_gpu_gives_cuda_tensors(tmp_path: Path, start_server, cuda_torch) -> None:
    add_model(tmp_path, "py_gpu", """
        backend: "python"
        input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
        output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
        instance_group [ { kind: KIND_GPU, count: 1 } ]
        """, PYTHON_GPU_PY)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(4, dtype=np.float32)
    for _ in range(40):  # on its thread, then (promoted) inline: the device copy either way
        r = _infer(client, "py_gpu", {"INPUT0": x})
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x * 2)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), x * 2 + 1)


def test_onnx_partial_config_is_completed(tmp_path: Path, start_server) -> None:
    model = modelgen.onnx_mlp(tmp_path, "partial", dims=(8, 4, 3), config=False)
    (model / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 2\ninput [ { name: "INPUT0" } ]\n')
    server = start_server(tmp_path)
    cfg = httpclient.InferenceServerClient(server.url).get_model_config("partial")
    assert cfg["max_batch_size"] == 2  # what the file says is kept
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [("INPUT0", "TYPE_FP32", [8])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [("OUTPUT0", "TYPE_FP32", [3])]
    assert "dynamic_batching" in cfg


def test_many_onnx_models_load_in_parallel(tmp_path: Path, start_server) -> None:
    """Five ONNX models on five load threads all load. A smoke test: the import race it can meet (first
    imports of one module on several native threads) is pinned down by tests/unit/test_import_lock.py."""
    for i in range(5):
        modelgen.onnx_mlp(tmp_path, f"mlp{i}", dims=(4, 8, 2), max_batch_size=4)
    server = start_server(tmp_path, flags=("--model-load-thread-count=5",))
    client = httpclient.InferenceServerClient(server.url)
    states = {e["name"]: e.get("state") for e in client.get_model_repository_index()}
    assert states == {f"mlp{i}": "READY" for i in range(5)}


IDENTITY_BACKEND_CONFIG = """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ -1 ] }, { name: "INPUT1", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1 ] }, { name: "OUTPUT1", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""


def test_triton_s_identity_backend(tmp_path: Path, start_server) -> None:
    """``backend: "identity"`` (Triton's test backend, which its qa suites serve): the n-th output is the
    n-th input; ``execute_delay_ms`` delays each execution (on the instance's thread); a config with more
    outputs than inputs is refused with the reason."""
    for name, extra in (("ident", ""), ("slow", 'parameters [ { key: "execute_delay_ms" value: { string_value: "300" } } ]')):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(IDENTITY_BACKEND_CONFIG + extra)
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "config.pbtxt").write_text(IDENTITY_BACKEND_CONFIG.replace(
        ', { name: "INPUT1", data_type: TYPE_STRING, dims: [ -1 ] }', ""))
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    client = httpclient.InferenceServerClient(server.url)
    ints, words = np.arange(6, dtype=np.int32).reshape(2, 3), np.array([[b"a", b"bc"]] * 2, dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [2, 3], "INT32"), httpclient.InferInput("INPUT1", [2, 2], "BYTES")]
    inputs[0].set_data_from_numpy(ints)
    inputs[1].set_data_from_numpy(words)
    for model in ("ident", "slow"):
        start = gevent.get_hub().loop.now()
        result = client.infer(model, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ints)
        assert result.as_numpy("OUTPUT1").tolist() == words.tolist()
        if model == "slow":
            gevent.get_hub().loop.update_now()
            assert gevent.get_hub().loop.now() - start >= 0.3  # a lower bound: true however busy the host
    assert not client.is_model_ready("bad")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "the identity backend needs an input for each output" in index["bad"]["reason"]

"""GPUs and runtimes (``triton_actor/backends/devices.py``): the GPU count from a fake driver folder, each
runtime's own answer, and a model actor on a (pretended) GPU host with this machine's CPU runtimes
(KIND_AUTO and models without instance_group must not fail to load there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scripts import modelgen
from triton_actor.actors.model.actor import ModelActor
from triton_actor.actors.model.handles import ModelHandle
from triton_actor.actors.model.messages import LoadSettings
from triton_actor.backends import onnxruntime as ort_backend
from triton_actor.backends import pytorch as torch_backend
from triton_actor.backends.devices import gpu_count, runtime_gpu_support
from triton_actor.errors import TritonError
from triton_actor.inference import InferInput, InferRequest
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime.kernel import Reply


def _driver(tmp_path: Path, gpus: int) -> Path:
    proc = tmp_path / "gpus"
    proc.mkdir()
    for i in range(gpus):
        (proc / f"0000:{i:02x}:00.0").mkdir()
    (proc / "not-a-gpu").write_text("")
    return proc


def test_gpu_count_from_the_driver_folder(tmp_path: Path) -> None:
    proc = _driver(tmp_path, 2)
    assert gpu_count({}, proc) == 2
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, proc) == 1
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, proc) == 2
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, proc) == 0
    assert gpu_count({"CUDA_VISIBLE_DEVICES": ""}, proc) == 0
    assert gpu_count({}, tmp_path / "no-driver") == 0


def test_runtime_answers() -> None:
    assert runtime_gpu_support("python") is None  # a device id only: nothing to ask
    assert runtime_gpu_support("fake") is None
    ort = pytest.importorskip("onnxruntime")
    answer = ort_backend.gpu_support()
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert answer is None
    else:
        assert answer is not None and "no CUDAExecutionProvider" in answer and "CPUExecutionProvider" in answer
    assert runtime_gpu_support("onnxruntime") == answer  # asked once, then remembered
    torch = pytest.importorskip("torch")
    answer = torch_backend.gpu_support()
    assert (answer is None) == torch.cuda.is_available()
    if answer is not None:
        assert "torch.cuda.is_available() is false" in answer


# -- a model actor that believes the host has one GPU, with this machine's ONNX Runtime ---------------------


@pytest.fixture
def gpu_host() -> Iterator[tuple[ModelActor, list[ModelHandle]]]:
    pytest.importorskip("onnxruntime")
    if ort_backend.gpu_support() is None:
        pytest.skip("this ONNX Runtime has CUDA: the CPU-wheel case cannot be seen here")
    published: list[ModelHandle] = []

    def publish(handle: ModelHandle) -> Reply[None]:
        published.append(handle)
        done: Reply[None] = Reply()
        done.set(None)
        return done

    actor = ModelActor("mlp", {"onnxruntime": ort_backend.OnnxRuntimeBackend()}, LoadSettings(gpu_count=1), publish)
    actor.start()
    yield actor, published
    actor.stop(timeout=10)


def test_cpu_wheel_on_gpu_host_serves_a_kind_left_to_us_on_the_cpu(tmp_path: Path, gpu_host) -> None:
    actor, published = gpu_host
    model_dir = modelgen.onnx_mlp(tmp_path, "mlp", dims=(4, 8, 2), config=False)  # no config: no instance_group
    actor.ref.load(model_dir).get(60)
    handle = published[-1]
    assert handle.ready_versions == (1,)
    group = handle.config.instance_group[0]
    assert (group.name, group.kind, group.count, list(group.gpus)) == ("mlp", 2, 2, [])  # KIND_CPU, Triton's 2
    x = np.ones((1, 4), np.float32)
    reply = handle.resolve(-1).infer(InferRequest("mlp", -1, "", {"INPUT0": InferInput("INPUT0", BY_WIRE["FP32"], (1, 4), x)}))
    assert reply.get(30).outputs[0][1].shape == (1, 2)


def test_cpu_wheel_on_gpu_host_refuses_explicit_kind_gpu_clearly(tmp_path: Path, gpu_host) -> None:
    actor, _published = gpu_host
    model_dir = modelgen.onnx_mlp(tmp_path, "mlp", dims=(4, 8, 2))
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    with pytest.raises(TritonError) as info:
        actor.ref.load(model_dir).get(60)
    assert "instance group mlp_0 of kind KIND_GPU but ONNX Runtime" in info.value.message
    assert "has no CUDAExecutionProvider" in info.value.message

"""System shared memory over HTTP and gRPC (one registry), with ``tritonclient.utils.shared_memory``."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from .clients import Client


@pytest.fixture
def regions(any_client: Client) -> Iterator[dict[str, object]]:
    """An input object holding INPUT0 and INPUT1 back to back, and an output object; unregistered after."""
    key = f"/triton_actor_test_{os.getpid()}_{any_client.protocol}"
    made = {"in": shm.create_shared_memory_region("in", key + "_in", 32),
            "out": shm.create_shared_memory_region("out", key + "_out", 32), "key": key}
    yield made
    any_client.unregister_system_shared_memory()
    shm.destroy_shared_memory_region(made["in"])
    shm.destroy_shared_memory_region(made["out"])


def test_round_trip(any_client: Client, regions: dict[str, object]) -> None:
    c, key = any_client, regions["key"]
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, dtype=np.float32)
    shm.set_shared_memory_region(regions["in"], [a, b])
    c.register_system_shared_memory("in", f"{key}_in", 32)
    c.register_system_shared_memory("out", f"{key}_out", 32)
    assert c.shm_status() == [{"name": "in", "key": f"{key}_in", "offset": 0, "byte_size": 32},
                              {"name": "out", "key": f"{key}_out", "offset": 0, "byte_size": 32}]
    inputs = [c.mod.InferInput("INPUT0", [4], "FP32"), c.mod.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_shared_memory("in", 16)
    inputs[1].set_data_from_numpy(b)  # one input from shared memory, one inline
    outputs = [c.output("OUTPUT0"), c.output("OUTPUT1")]
    outputs[0].set_shared_memory("out", 16)
    outputs[1].set_shared_memory("out", 16, offset=16)
    result = c.infer("add_sub", inputs, outputs=outputs)
    # gRPC names the window in the output's parameters; HTTP sends none (as Triton: its C++ client,
    # perf_analyzer --shared-memory, reads binary_data_size from any output with parameters)
    expected = {"shared_memory_region": "out", "shared_memory_byte_size": 16, "shared_memory_offset": 16}
    assert c.output_parameters(result, "OUTPUT1") == (expected if c.grpc else {})
    np.testing.assert_array_equal(shm.get_contents_as_numpy(regions["out"], np.float32, [4]), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(regions["out"], np.float32, [4], offset=16), a - b)


def test_bounds_and_errors(any_client: Client, regions: dict[str, object]) -> None:
    c, key = any_client, regions["key"]
    c.register_system_shared_memory("in", f"{key}_in", 16, offset=16)  # a window on the object's second half
    for args, status, text in [
        (("in", f"{key}_in", 16), c.expect("ALREADY_EXISTS", 400), "already in manager"),
        (("big", f"{key}_in", 64), c.expect("INVALID_ARGUMENT", 400), "under a different name"),
        (("x", "/../../etc/passwd", 8), c.expect("INVALID_ARGUMENT", 400), "is not a shared memory key"),
        (("x", "/no_such_key_here", 8), c.expect("INTERNAL", 500), "Unable to open shared memory region"),
    ]:
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory(*args)
        assert (c.status(e.value), text in e.value.message()) == (status, True), e.value
    with pytest.raises(InferenceServerException) as e:
        c.get_system_shared_memory_status("nope")
    assert c.status(e.value) == c.expect("NOT_FOUND", 404)
    for region, offset, size, code, text in [
            ("in", 8, 16, ("INVALID_ARGUMENT", 400), "do not fit shared memory region 'in'"),
            ("in", -4, 16, ("INVALID_ARGUMENT", 400), "non-negative"),
            ("nope", 0, 16, ("NOT_FOUND", 404), "Unable to find shared memory region: 'nope'")]:
        inputs = [c.mod.InferInput("INPUT0", [4], "FP32"), c.mod.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_shared_memory(region, size, offset=offset)
        inputs[1].set_data_from_numpy(np.zeros(4, np.float32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("add_sub", inputs)
        assert (c.status(e.value), text in e.value.message()) == (c.expect(*code), True), e.value
    outputs = [c.output("OUTPUT0")]
    outputs[0].set_shared_memory("in", 8)  # 16 bytes of results do not fit in 8
    inputs = [c.input("INPUT0", np.zeros(4, np.float32), "FP32"), c.input("INPUT1", np.zeros(4, np.float32), "FP32")]
    with pytest.raises(InferenceServerException) as e:
        c.infer("add_sub", inputs, outputs=outputs)
    assert "should be at least 16 bytes" in e.value.message()
    c.unregister_system_shared_memory("in")
    assert c.shm_status() == []
    assert c.is_server_live()


# what tritonclient.utils.cuda_shared_memory.get_raw_handle gives: a cudaIpcMemHandle_t's 64 bytes in base64
CUDA_HANDLE = base64.b64encode(bytes(64))


def test_cuda_shared_memory_is_unsupported(any_client: Client) -> None:
    with pytest.raises(InferenceServerException) as e:
        any_client.register_cuda_shared_memory("c", CUDA_HANDLE, 0, 16)
    assert any_client.status(e.value) == any_client.expect("UNIMPLEMENTED", 501)
    assert "CUDA shared memory is not supported" in e.value.message()
    # a handle that is not one (Triton's L0_grpc aio test sends b""): Triton's answer on a GPU host
    with pytest.raises(InferenceServerException) as e:
        any_client.register_cuda_shared_memory("c", base64.b64encode(b"x" * 48), 0, 0)
    assert any_client.status(e.value) == any_client.expect("INVALID_ARGUMENT", 400)
    assert e.value.message() == "failed to register shared memory region: invalid args"

"""System shared memory over HTTP, the cases test_shared_memory.py (both protocols) leaves out: BYTES
tensors, a registered window with an offset, every way out of a window, bad keys, the --allow-client-shm switch."""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

F32_4 = 16  # bytes of an FP32[4] tensor


@pytest.fixture
def client(example_server):  # the session's example server runs with --allow-client-shm=true
    c = httpclient.InferenceServerClient(example_server.url)
    c.unregister_system_shared_memory()
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions():
    """Create named POSIX regions for a test and destroy them afterwards."""
    made: list = []

    def make(name: str, size: int):
        handle = shm.create_shared_memory_region(name, f"/ta_{name}_{os.getpid()}", size)
        made.append(handle)
        return handle, f"/ta_{name}_{os.getpid()}"

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _add_sub_inputs(in_name: str, offsets: tuple[int, int] = (0, F32_4)) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    for tensor, offset in zip(inputs, offsets, strict=True):
        tensor.set_shared_memory(in_name, F32_4, offset=offset)
    return inputs


def test_inputs_and_outputs_through_shared_memory(client, regions) -> None:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    inp, in_key = regions("in", 2 * F32_4)
    out, out_key = regions("out", 2 * F32_4)
    shm.set_shared_memory_region(inp, [a, b])
    client.register_system_shared_memory("in", in_key, 2 * F32_4)
    client.register_system_shared_memory("out", out_key, 2 * F32_4)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status["in"] == {"name": "in", "key": in_key, "offset": 0, "byte_size": 2 * F32_4}
    assert client.get_system_shared_memory_status("out") == [
        {"name": "out", "key": out_key, "offset": 0, "byte_size": 2 * F32_4}]
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", F32_4)
    outputs[1].set_shared_memory("out", F32_4, offset=F32_4)
    result = client.infer("add_sub", _add_sub_inputs("in"), outputs=outputs)
    entry = result.get_output("OUTPUT0")
    # the data is in the region, not in the response; no parameters either (as Triton's HTTP answer)
    assert entry == {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.float32, [4]), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.float32, [4], offset=F32_4), a - b)
    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out"]


def test_bytes_tensors_through_shared_memory(client, regions) -> None:
    text = np.array([[b"hello", b"shared memory"]], dtype=np.object_)
    serialized = serialize_byte_tensor(text)
    size = serialized_byte_size(serialized)
    inp, key = regions("text", size)
    shm.set_shared_memory_region(inp, [serialized])
    client.register_system_shared_memory("text", key, size)
    tensor = httpclient.InferInput("TEXT", [1, 2], "BYTES")
    tensor.set_shared_memory("text", size)
    result = client.infer("string_ops", [tensor])
    assert result.as_numpy("UPPER").tolist() == [[b"HELLO", b"SHARED MEMORY"]]


def test_registered_window_with_an_offset(client, regions) -> None:
    handle, key = regions("window", 64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    client.register_system_shared_memory("window", key, 2 * F32_4, offset=16)  # floats 4..11
    result = client.infer("add_sub", _add_sub_inputs("window"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, 8) + np.arange(8, 12))


@pytest.mark.parametrize(("offset", "size", "words"), [
    (F32_4 * 2, F32_4, "do not fit"),  # past the registered window
    (0, 8, "byte size mismatch"),  # fewer bytes than FP32[4] needs
    (2 ** 40, F32_4, "do not fit"),
])
def test_reads_outside_the_window_are_refused(client, regions, offset: int, size: int, words: str) -> None:
    _handle, key = regions("small", 2 * F32_4)
    client.register_system_shared_memory("small", key, 2 * F32_4)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_shared_memory("small", size, offset=offset)
    other = httpclient.InferInput("INPUT1", [4], "FP32")
    other.set_data_from_numpy(np.zeros(4, np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [tensor, other])
    assert e.value.status() == "400" and words in e.value.message()
    result = client.infer("add_sub", _add_sub_inputs("small"))  # still serving, the region still usable
    assert result.as_numpy("OUTPUT0").shape == (4,)


def test_output_region_too_small(client, regions) -> None:
    _handle, key = regions("tiny", 2 * F32_4)
    client.register_system_shared_memory("tiny", key, 2 * F32_4)
    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("tiny", 8)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", _add_sub_inputs("tiny"), outputs=[out])
    assert e.value.status() == "400" and "should be at least 16 bytes" in e.value.message()


def test_bad_registrations(client, regions) -> None:
    _handle, key = regions("dup", 32)
    client.register_system_shared_memory("dup", key, 32)
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("dup", key, 32)
    with pytest.raises(InferenceServerException, match="under a different name"):
        client.register_system_shared_memory("dup2", key, 32)
    with pytest.raises(InferenceServerException, match="invalid args"):
        client.register_system_shared_memory("big", regions("big", 32)[1], 64)
    for bad_key in ("/../../etc/passwd", "/a/b", "..", ""):
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory("escape", bad_key, 8)
        assert e.value.status() == "400", bad_key
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("missing", "/ta_no_such_region", 8)
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status("nope")
    assert e.value.status() == "404" and "Unable to find system shared memory region: 'nope'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", _add_sub_inputs("nope"))
    assert e.value.status() == "404"
    client.unregister_system_shared_memory("nope")  # unknown names unregister quietly, as in Triton


def test_cuda_shared_memory_is_refused_clearly(client) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory("gpu", base64.b64encode(bytes(64)), 0, 16)
    assert e.value.status() == "501" and "CUDA shared memory" in e.value.message()
    assert client.get_cuda_shared_memory_status() == []


def test_shared_memory_is_off_unless_allowed(start_server, tmp_path) -> None:
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("r", "/whatever", 8)
    # Triton's answer since it turned client shared memory off by default (server PR #8721), word for word
    disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    assert e.value.status() == "501" and e.value.message() == disabled
    with pytest.raises(InferenceServerException) as e:
        client.unregister_system_shared_memory()
    assert e.value.status() == "501" and e.value.message() == disabled
    # the status calls answer, as Triton's do: nothing is registered
    assert client.get_system_shared_memory_status() == [] and client.get_cuda_shared_memory_status() == []
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        grpc.register_system_shared_memory("r", "/whatever", 8)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED" and e.value.message() == disabled
    assert list(grpc.get_system_shared_memory_status().regions) == []

"""Unit tests for the in-process ``triton_python_backend_utils`` module."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import sys
import threading

import numpy as np
import pytest

from triton_actor.backends.python import triton_python_backend_utils as pb_utils
from triton_actor.backends.python.triton_python_backend_utils import serving

ALL_TYPES = [
    ("TYPE_BOOL", 1, np.bool_),
    ("TYPE_UINT8", 2, np.uint8),
    ("TYPE_UINT16", 3, np.uint16),
    ("TYPE_UINT32", 4, np.uint32),
    ("TYPE_UINT64", 5, np.uint64),
    ("TYPE_INT8", 6, np.int8),
    ("TYPE_INT16", 7, np.int16),
    ("TYPE_INT32", 8, np.int32),
    ("TYPE_INT64", 9, np.int64),
    ("TYPE_FP16", 10, np.float16),
    ("TYPE_FP32", 11, np.float32),
    ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_),
]


@pytest.fixture
def hooks():
    """A server's hooks (``pb_utils.serving.ServerHooks``), current while the test runs."""
    server = serving.ServerHooks()
    with serving.using(server):
        yield server


@pytest.fixture
def metric_registry():
    """A clean metric family registry: a server of the test's own, current while it runs."""
    server = serving.ServerHooks()
    with serving.using(server):
        yield server.metrics.families


def _config(**extra):
    cfg = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    cfg.update(extra)
    return cfg


# ---------------------------------------------------------------------------- constants


def test_constants():
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.TRITONSERVER_MEMORY_CPU == 0
    assert pb_utils.TRITONSERVER_MEMORY_CPU_PINNED == 1
    assert pb_utils.TRITONSERVER_MEMORY_GPU == 2


def test_module_alias_is_same_object(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    import triton_python_backend_utils as aliased

    assert aliased is pb_utils
    assert aliased.Tensor is pb_utils.Tensor


def test_backend_serves_this_package_under_the_model_import_name():
    from triton_actor.backends.python import backend

    assert sys.modules["triton_python_backend_utils"] is pb_utils
    assert backend.pb_utils is pb_utils


PUBLIC_NAMES = {
    "COUNTER", "GAUGE", "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_CPU_PINNED", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY",
    "TYPE_BF16", "TYPE_BOOL", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_INT8", "TYPE_INT16",
    "TYPE_INT32", "TYPE_INT64", "TYPE_INVALID", "TYPE_STRING", "TYPE_UINT8", "TYPE_UINT16",
    "TYPE_UINT32", "TYPE_UINT64",
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "InferenceTrace",
    "LogLevel", "Logger", "Metric", "MetricFamily", "MetricKind", "ModelConfig", "PreferredMemory",
    "Tensor", "TritonError", "TritonModelException",
    "deserialize_bytes_tensor", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_output_config_by_name", "get_output_tensor_by_name", "is_model_ready", "load_model",
    "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type",
    "unload_model", "using_decoupled_model_transaction_policy",
}


def test_public_face():
    """``__init__`` re-exports every public name, and only those; the rest are its submodules."""
    import types

    assert set(pb_utils.__all__) == PUBLIC_NAMES
    public = {n for n, v in vars(pb_utils).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public - {"annotations"} == PUBLIC_NAMES
    namespace: dict = {}
    exec(f"from {pb_utils.__name__} import *", namespace)  # what `import *` in a model.py gets
    assert set(namespace) - {"__builtins__"} == PUBLIC_NAMES


def test_preferred_memory():
    pm = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
    assert pm.memory_type == 2 and pm.device_id == 1
    assert pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU).device_id == 0
    assert pm == pb_utils.PreferredMemory(2, 1)
    with pytest.raises(ValueError):
        pb_utils.PreferredMemory(42)


# ---------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(("type_string", "number", "np_type"), ALL_TYPES)
def test_dtype_round_trips(type_string, number, np_type):
    assert pb_utils.triton_to_numpy_type(number) is np_type
    assert pb_utils.numpy_to_triton_type(np_type) == number
    assert pb_utils.numpy_to_triton_type(np.dtype(np_type)) == number
    assert pb_utils.numpy_to_triton_type(pb_utils.triton_to_numpy_type(number)) == number
    from_string = pb_utils.triton_string_to_numpy(type_string)
    assert from_string is pb_utils.TRITON_STRING_TO_NUMPY[type_string]
    assert pb_utils.numpy_to_triton_type(from_string) == number
    # A tensor of that type reports the same number.
    if np_type is np.object_:
        array = np.array([b"a", b"bc"], dtype=np.object_)
    else:
        array = np.zeros((2, 3), dtype=np_type)
    assert pb_utils.Tensor("t", array).triton_dtype() == number


def test_dtype_special_cases():
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_STRING"] is np.object_
    assert len(pb_utils.TRITON_STRING_TO_NUMPY) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.str_) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype("S5")) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype("<U3")) == 13
    assert pb_utils.numpy_to_triton_type(bool) == 1
    assert pb_utils.numpy_to_triton_type("float32") == 11
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.numpy_to_triton_type(None) is None
    assert pb_utils.numpy_to_triton_type([1, 2]) is None
    assert pb_utils.triton_to_numpy_type(0) is None  # TYPE_INVALID
    assert pb_utils.triton_to_numpy_type(14) is None  # TYPE_BF16: no numpy type
    assert pb_utils.triton_to_numpy_type("TYPE_FP32") is None
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


# ---------------------------------------------------------------------------- BYTES


def test_serialize_exact_wire_format():
    data = np.array([b"ab", b""], dtype=np.object_)
    assert pb_utils.serialize_byte_tensor(data) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


@pytest.mark.parametrize(
    "values",
    [
        [b"hello", b"", b"\x00\xff", "héllo wörld ✓".encode(), b"x" * 1000],
        [b""],
        ["日本語".encode()],
    ],
)
def test_bytes_round_trip(values):
    array = np.array(values + [b"tail"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(array)
    assert isinstance(encoded, bytes)
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_ and decoded.ndim == 1
    assert list(decoded) == values + [b"tail"]
    assert all(type(x) is bytes for x in decoded)


def test_serialize_str_and_other_elements():
    array = np.array(["héllo", "", 7, b"raw"], dtype=np.object_)
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array))
    assert list(decoded) == ["héllo".encode(), b"", b"7", b"raw"]
    unicode_array = np.array(["ü", "ab"])
    assert list(
        pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(unicode_array))
    ) == ["ü".encode(), b"ab"]
    fixed = np.array([b"a", b"bcd"], dtype="S3")
    assert list(pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(fixed))) == [
        b"a",
        b"bcd",
    ]


def test_serialize_uses_c_order_and_edge_cases():
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_)
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array.T))
    assert list(decoded) == [b"a", b"c", b"b", b"d"]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None


def test_deserialize_inputs_and_errors():
    encoded = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0)
    for source in (encoded, bytearray(encoded), memoryview(encoded)):
        assert list(pb_utils.deserialize_bytes_tensor(source)) == [b"abc", b""]
    as_uint8 = np.frombuffer(encoded, dtype=np.uint8)
    assert list(pb_utils.deserialize_bytes_tensor(as_uint8)) == [b"abc", b""]
    empty = pb_utils.deserialize_bytes_tensor(b"")
    assert empty.shape == (0,) and empty.dtype == np.object_
    with pytest.raises(ValueError):
        pb_utils.deserialize_bytes_tensor(struct.pack("<I", 10) + b"abc")
    with pytest.raises(ValueError):
        pb_utils.deserialize_bytes_tensor(b"\x01\x00")


# ---------------------------------------------------------------------------- Tensor


def test_tensor_basics():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("OUT", array)
    assert tensor.name() == "OUT"
    assert tensor.as_numpy() is array  # no copy
    assert tensor.shape() == [2, 3]
    assert all(type(d) is int for d in tensor.shape())
    assert tensor.triton_dtype() == 11
    assert tensor.is_cpu() is True
    assert pb_utils.Tensor("s", np.array(3.0)).shape() == []
    assert pb_utils.Tensor("g", np.float64(2.5)).as_numpy().shape == ()
    assert "OUT" in repr(tensor)


def test_tensor_makes_contiguous_and_native():
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    view = base[:, ::2]
    tensor = pb_utils.Tensor("x", view)
    out = tensor.as_numpy()
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, view)
    big_endian = np.arange(3, dtype=">i4")
    swapped = pb_utils.Tensor("be", big_endian).as_numpy()
    assert swapped.dtype.isnative
    np.testing.assert_array_equal(swapped, [0, 1, 2])


def test_tensor_string_arrays_kept_as_given():
    objects = np.array([b"a", b"b"], dtype=np.object_)
    assert pb_utils.Tensor("o", objects).as_numpy() is objects
    unicode = np.array(["x", "yz"])
    tensor = pb_utils.Tensor("u", unicode)
    assert tensor.as_numpy() is unicode
    assert tensor.as_numpy().dtype.kind == "U"
    assert tensor.triton_dtype() == 13
    python_strings = np.array(["a", "b"], dtype=np.object_)
    assert pb_utils.Tensor("p", python_strings).as_numpy()[0] == "a"
    assert pb_utils.Tensor("p", python_strings).triton_dtype() == 13
    assert pb_utils.Tensor("fixed", np.array([b"ab"], dtype="S2")).triton_dtype() == 13


@pytest.mark.parametrize("bad", [[1, 2, 3], (1.0,), 3, "text", b"raw", None, {"a": 1}])
def test_tensor_rejects_non_arrays(bad):
    """pybind11's plain TypeError, as Triton 2.51 raises it (no TritonModelException: a model that catches
    that one does not catch this), even with an empty name: the arguments are converted first."""
    for name in ("x", ""):
        with pytest.raises(TypeError) as info:
            pb_utils.Tensor(name, bad)
        assert not isinstance(info.value, pb_utils.TritonModelException)
        assert str(info.value) == (
            "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
            "    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n\n"
            f"Invoked with: {name!r}, {bad!r}")


def test_tensor_rejects_bad_name_and_dtype():
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(TypeError):
        pb_utils.Tensor(5, np.zeros(1))
    with pytest.raises(TypeError):
        pb_utils.Tensor("c", np.zeros(2, dtype=np.complex64))


def test_tensor_accepts_array_like_objects():
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.array([1, 2], dtype=np.int16)

    tensor = pb_utils.Tensor("a", ArrayLike())
    assert tensor.triton_dtype() == 7
    np.testing.assert_array_equal(tensor.as_numpy(), [1, 2])


def test_dlpack_round_trip_via_capsule():
    array = np.arange(10, dtype=np.float32).reshape(2, 5)
    tensor = pb_utils.Tensor("a", array)
    capsule = tensor.to_dlpack()
    assert type(capsule).__name__ == "PyCapsule"
    back = pb_utils.Tensor.from_dlpack("b", capsule)
    assert back.name() == "b"
    assert back.triton_dtype() == 11
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert np.shares_memory(back.as_numpy(), array)


def test_dlpack_protocol():
    array = np.arange(4, dtype=np.int64)
    tensor = pb_utils.Tensor("a", array)
    assert tensor.__dlpack_device__() == (1, 0)
    consumed = np.from_dlpack(tensor)
    np.testing.assert_array_equal(consumed, array)
    assert np.shares_memory(consumed, array)
    from_obj = pb_utils.Tensor.from_dlpack("b", array)
    assert np.shares_memory(from_obj.as_numpy(), array)
    bools = pb_utils.Tensor.from_dlpack("c", np.array([True, False]))
    assert bools.triton_dtype() == 1


def _on_device(capsule, device_type: int = 2):
    """``capsule`` (a legacy "dltensor" one, unconsumed) relabelled as living on ``device_type`` (kDLCUDA)."""
    from triton_actor.backends.python.triton_python_backend_utils import dlpack

    head = dlpack._DLTensorHead.from_address(dlpack._get_pointer(capsule, b"dltensor"))
    head.device_type = device_type
    assert dlpack.device_type(capsule) == device_type
    return capsule


def test_a_device_tensor_from_dlpack_is_copied_to_the_host(monkeypatch):
    """A KIND_GPU model's output capsule (a CUDA tensor) is copied to the host through torch, where numpy
    refused it before. No GPU here: torch's import of the capsule is stood in for (the real one runs in
    tests/integration/test_backends.py on a GPU host)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a relabelled host capsule must not reach a real CUDA import")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    seen = []

    def from_dlpack(capsule):
        seen.append(dlpack.device_type(capsule))
        return torch.from_numpy(data.copy())

    from triton_actor.backends.python.triton_python_backend_utils import dlpack

    monkeypatch.setattr(torch.utils.dlpack, "from_dlpack", from_dlpack)
    tensor = pb_utils.Tensor.from_dlpack("OUT", _on_device(np.ascontiguousarray(data).__dlpack__()))
    assert seen == [2] and tensor.is_cpu() and tensor.triton_dtype() == 11
    np.testing.assert_array_equal(tensor.as_numpy(), data)


def test_a_device_tensor_torch_cannot_read_is_a_clear_error():
    """Without a GPU, torch's own refusal of a CUDA capsule is the model's error, named."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a relabelled host capsule must not reach a real CUDA import")
    capsule = _on_device(np.zeros(3, np.float32).__dlpack__())
    with pytest.raises(pb_utils.TritonModelException, match="is in device memory and could not be copied to the host"):
        pb_utils.Tensor.from_dlpack("OUT", capsule)


def test_dlpack_read_only_and_unsupported():
    read_only = np.frombuffer(np.arange(3, dtype=np.float64).tobytes(), dtype=np.float64)
    assert not read_only.flags.writeable
    tensor = pb_utils.Tensor("r", read_only)
    back = pb_utils.Tensor.from_dlpack("r2", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(np.from_dlpack(tensor), [0.0, 1.0, 2.0])
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("s", np.array([b"x"], dtype=np.object_)).to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="Tensor must be a DLPack capsule"):
        pb_utils.Tensor.from_dlpack("bad", [1, 2])  # pb_tensor.cc's check, not pybind11's
    with pytest.raises(pb_utils.TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        pb_utils.Tensor.from_dlpack("", None)
    with pytest.raises(TypeError, match=r"^from_dlpack\(\): incompatible function arguments"):
        pb_utils.Tensor.from_dlpack(None, np.zeros(1))


# ---------------------------------------------------------------------------- BF16 (Triton's pb_tensor.cc)

BF16_NO_NUMPY = "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."


def test_bf16_comes_from_dlpack_and_has_no_numpy():
    torch = pytest.importorskip("torch")
    source = torch.tensor([[1.5, -2.0], [3.25, 0.0]], dtype=torch.bfloat16)
    for given in (source, torch.utils.dlpack.to_dlpack(source)):  # an object with __dlpack__, or a capsule
        tensor = pb_utils.Tensor.from_dlpack("X", given)
        assert (tensor.name(), tensor.triton_dtype(), tensor.shape()) == ("X", pb_utils.TYPE_BF16, [2, 2])
        with pytest.raises(pb_utils.TritonModelException) as e:
            tensor.as_numpy()
        assert str(e.value) == BF16_NO_NUMPY
        # the bit patterns are kept, and nothing is copied
        assert tensor._array.tobytes() == source.view(torch.int16).numpy().tobytes()
    source[0, 0] = 7.0
    assert torch.from_dlpack(tensor)[0, 0].item() == 7.0


def test_bf16_goes_back_through_dlpack_as_bfloat16():
    torch = pytest.importorskip("torch")
    source = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("X", source)
    for out in (torch.utils.dlpack.from_dlpack(tensor.to_dlpack()), torch.from_dlpack(tensor)):
        assert out.dtype == torch.bfloat16 and torch.equal(out, source)
    again = pb_utils.Tensor.from_dlpack("Y", tensor.to_dlpack())  # Triton's own bf16 model does this
    assert again.triton_dtype() == pb_utils.TYPE_BF16
    assert torch.equal(torch.from_dlpack(again), source)
    strided = pb_utils.Tensor.from_dlpack("T", source.t())  # non-contiguous: copied into C order
    assert torch.equal(torch.from_dlpack(strided), source.t())


def test_bf16_server_input_and_numpy_never_bf16():
    raw = np.frombuffer(np.array([0x3FC0, 0xC000], "<u2").tobytes(), "V2")  # 1.5, -2.0 as the server holds them
    tensor = pb_utils.Tensor._trusted("I", raw, pb_utils.TYPE_BF16)
    with pytest.raises(pb_utils.TritonModelException, match="cannot be converted to NumPy"):
        tensor.as_numpy()
    torch = pytest.importorskip("torch")
    assert torch.from_dlpack(tensor).tolist() == [1.5, -2.0]
    with pytest.raises(TypeError):  # a numpy array is never BF16, whatever its element size
        pb_utils.Tensor("V", raw)
    u16 = pb_utils.Tensor.from_dlpack("U", np.array([1, 2], np.uint16))  # uint16 stays UINT16
    assert u16.triton_dtype() == pb_utils.TYPE_UINT16


# ---------------------------------------------------------------------------- errors


def test_triton_error_codes():
    codes = {
        "UNKNOWN": 0,
        "INTERNAL": 1,
        "NOT_FOUND": 2,
        "INVALID_ARG": 3,
        "UNAVAILABLE": 4,
        "UNSUPPORTED": 5,
        "ALREADY_EXISTS": 6,
        "CANCELLED": 7,
    }
    for name, value in codes.items():
        assert getattr(pb_utils.TritonError, name) == value
        err = pb_utils.TritonError(f"msg {name}", getattr(pb_utils.TritonError, name))
        assert err.code() == value
        assert err.message() == f"msg {name}"


def test_triton_error_defaults_and_text():
    err = pb_utils.TritonError("boom")
    assert err.code() == pb_utils.TritonError.INTERNAL
    assert str(err) == "boom"
    assert repr(err) == "boom"
    assert pb_utils.TritonError(message="m", code=pb_utils.TritonError.NOT_FOUND).code() == 2
    assert repr(pb_utils.TritonError.CANCELLED) == "<__ErrorCode.CANCELLED: 7>"
    # Triton binds the codes as an enum: a plain number is pybind11's TypeError, as a string or None
    for bad in (99, 3, "INTERNAL", None):
        with pytest.raises(TypeError, match=r"^__init__\(\): incompatible constructor arguments") as info:
            pb_utils.TritonError("x", bad)
        assert not isinstance(info.value, pb_utils.TritonModelException)
        assert str(info.value).endswith(f"Invoked with: 'x', {bad!r}")
    with pytest.raises(TypeError, match=r"Invoked with: None$"):
        pb_utils.TritonError(None)


def test_triton_model_exception():
    with pytest.raises(pb_utils.TritonModelException) as info:
        raise pb_utils.TritonModelException("bad input")
    assert str(info.value) == "bad input"
    assert info.value.message() == "bad input"
    assert isinstance(info.value, Exception)


# ---------------------------------------------------------------------------- requests


def test_request_defaults():
    req = pb_utils.InferenceRequest()
    assert req.request_id() == ""
    assert req.correlation_id() == 0
    assert req.inputs() == []
    assert req.requested_output_names() == []
    assert req.model_name() == ""
    assert req.model_version() == -1
    assert req.flags() == 0
    assert req.timeout() == 0
    assert req.parameters() == "{}"
    assert req.preferred_memory() is None
    assert req.trace().get_context() is None
    assert req.is_cancelled() is False


def test_request_fields():
    a = pb_utils.Tensor("A", np.zeros(2, dtype=np.float32))
    pm = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)
    req = pb_utils.InferenceRequest(
        request_id="r1",
        correlation_id="seq-7",
        inputs=[a],
        requested_output_names=["OUT"],
        model_name="target",
        model_version=3,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=1000,
        preferred_memory=pm,
    )
    assert req.request_id() == "r1"
    assert req.correlation_id() == "seq-7"
    assert req.inputs() == [a]
    assert req.requested_output_names() == ["OUT"]
    assert req.model_name() == "target"
    assert req.model_version() == 3
    assert req.flags() == 1
    req.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert req.flags() == 2
    assert req.timeout() == 1000
    assert req.preferred_memory() is pm
    req.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert req._release_flags == 2


def test_request_parameters_json():
    params = {"temperature_x100": 70, "greedy": True, "mode": "fast"}
    req = pb_utils.InferenceRequest(parameters=params)
    text = req.parameters()
    assert isinstance(text, str)
    assert json.loads(text) == params
    assert req.parameters() is text  # computed once, cached
    raw = '{"k": "v"}'
    assert pb_utils.InferenceRequest(parameters=raw).parameters() == raw
    assert pb_utils.InferenceRequest(parameters=raw)._parameters_dict() == {"k": "v"}


def test_request_parameters_accept_floats():
    # Triton passes DOUBLE request parameters on to models, so requests accept floats.
    req = pb_utils.InferenceRequest(parameters={"temperature": 0.7})
    assert json.loads(req.parameters()) == {"temperature": 0.7}


@pytest.mark.parametrize("bad", [{"n": None}, {"l": [1]}, {"d": {}}, {1: "x"}, [1]])
def test_request_parameters_rejected(bad):
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(parameters=bad)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(parameters=bad)


def test_get_input_tensor_by_name():
    a = pb_utils.Tensor("A", np.zeros(1))
    b = pb_utils.Tensor("B", np.ones(1))
    dup = pb_utils.Tensor("A", np.full(1, 5.0))
    req = pb_utils.InferenceRequest(inputs=[a, b, dup])
    assert pb_utils.get_input_tensor_by_name(req, "A") is a  # first one wins, like Triton
    assert pb_utils.get_input_tensor_by_name(req, "B") is b
    assert pb_utils.get_input_tensor_by_name(req, "C") is None
    # as Triton's pybind11 binding, inputs() is a new list each call and the request keeps its own copy
    # of the list it was given: changing either leaves the request's inputs as they were
    given = [a]
    req = pb_utils.InferenceRequest(inputs=given)
    c = pb_utils.Tensor("C", np.zeros(1))
    req.inputs().append(c)
    given.append(c)
    assert req.inputs() == [a] and req.inputs() is not req.inputs()
    assert pb_utils.get_input_tensor_by_name(req, "C") is None

    class DuckRequest:
        def inputs(self):
            return [b]

    assert pb_utils.get_input_tensor_by_name(DuckRequest(), "B") is b
    assert pb_utils.get_input_tensor_by_name(DuckRequest(), "A") is None


def test_response_sender_and_cancellation():
    req = pb_utils.InferenceRequest()
    with pytest.raises(pb_utils.TritonModelException, match="response sender"):
        req.get_response_sender()
    sender = object()
    req._response_sender = sender
    assert req.get_response_sender() is sender
    req._cancelled = True
    assert req.is_cancelled() is True


def test_bls_without_executor(hooks):
    hooks.bls_executor = None
    hooks.bls_async_executor = None
    req = pb_utils.InferenceRequest(model_name="other", inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not supported"):
        req.exec()
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not supported"):
        req.async_exec()


def test_bls_with_executor(hooks):
    calls = []
    response = pb_utils.InferenceResponse()

    def executor(request, decoupled):
        calls.append((request, decoupled))
        return response

    hooks.bls_executor = executor
    hooks.bls_async_executor = None
    req = pb_utils.InferenceRequest(model_name="other")
    assert req.exec() is response
    assert req.exec(decoupled=True) is response
    assert calls == [(req, False), (req, True)]

    async def run_async():
        return await req.async_exec()

    assert asyncio.run(run_async()) is response  # falls back to the sync executor

    async def async_executor(request, decoupled):
        return ("async", request, decoupled)

    hooks.bls_async_executor = async_executor

    async def run_async_hook():
        return await req.async_exec(decoupled=True)

    assert asyncio.run(run_async_hook()) == ("async", req, True)


# ---------------------------------------------------------------------------- responses


def test_response_basics():
    out = pb_utils.Tensor("OUT", np.zeros(2))
    resp = pb_utils.InferenceResponse(output_tensors=[out])
    assert resp.output_tensors() == [out]
    assert resp.has_error() is False
    assert resp.error() is None
    assert resp.parameters() == "{}"
    assert pb_utils.get_output_tensor_by_name(resp, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(resp, "nope") is None
    assert pb_utils.InferenceResponse().output_tensors() == []
    assert pb_utils.InferenceResponse((out,)).output_tensors() == [out]


def test_response_error_and_parameters():
    err = pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    resp = pb_utils.InferenceResponse(error=err, parameters={"a": 1, "b": "x", "c": False})
    assert resp.has_error() is True
    assert resp.error() is err
    assert resp.error().code() == 3
    assert json.loads(resp.parameters()) == {"a": 1, "b": "x", "c": False}
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str, found type"):
        pb_utils.InferenceResponse(parameters={"int": 2, "float": 0.5})
    with pytest.raises(TypeError, match="keys to have type str"):
        pb_utils.InferenceResponse(parameters={1: "int key"})
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(parameters={"null": None})


def test_response_rejects_bad_arguments():
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=pb_utils.Tensor("x", np.zeros(1)))
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(error="plain string")


# ---------------------------------------------------------------------------- config helpers


def test_config_lookups():
    cfg = _config(
        input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        output=[{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
    )
    assert pb_utils.get_input_config_by_name(cfg, "IN")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(cfg, "OUT") is None
    assert pb_utils.get_output_config_by_name(cfg, "OUT")["dims"] == [-1]
    assert pb_utils.get_output_config_by_name(cfg, "IN") is None
    assert pb_utils.get_input_config_by_name({}, "IN") is None
    assert pb_utils.get_output_config_by_name(pb_utils.ModelConfig(cfg), "OUT") is not None


def test_using_decoupled():
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    cfg_true = {"model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(cfg_true) is True
    cfg_false = {"model_transaction_policy": {"decoupled": False}}
    assert pb_utils.using_decoupled_model_transaction_policy(cfg_false) is False
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {}}) is False


# ---------------------------------------------------------------------------- ModelConfig


def test_model_config_from_json_and_dict():
    text = json.dumps(_config(name="jm"))
    mc = pb_utils.ModelConfig(text)
    assert mc.as_dict()["name"] == "jm"
    raw = _config()
    wrapped = pb_utils.ModelConfig(raw)
    assert wrapped.as_dict() is raw
    with pytest.raises(TypeError):
        pb_utils.ModelConfig(42)


def test_set_max_batch_size():
    mc = pb_utils.ModelConfig(_config())
    mc.set_max_batch_size(8)
    assert mc.as_dict()["max_batch_size"] == 8
    mc.set_max_batch_size(16)
    assert mc.as_dict()["max_batch_size"] == 16
    with pytest.raises(ValueError, match="model 'm'") as info:
        mc.set_max_batch_size(4)
    assert "max_batch_size 16" in str(info.value) and "max_batch_size 4" in str(info.value)


def test_set_dynamic_batching():
    mc = pb_utils.ModelConfig(_config())
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {}
    mc.as_dict()["dynamic_batching"] = {"max_queue_delay_microseconds": 100}
    mc.set_dynamic_batching()  # already set: kept unchanged
    assert mc.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    for other in ("sequence_batching", "ensemble_scheduling"):
        conflicted = pb_utils.ModelConfig(_config(**{other: {}}))
        with pytest.raises(ValueError, match=other) as info:
            conflicted.set_dynamic_batching()
        assert "'m'" in str(info.value)


def test_add_input_and_merge():
    cfg = _config(
        input=[
            {"name": "A", "data_type": "TYPE_INVALID", "dims": []},
            {"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": False},
        ]
    )
    mc = pb_utils.ModelConfig(cfg)
    mc.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2, 2]})
    assert cfg["input"][0] == {"name": "A", "data_type": "TYPE_INT32", "dims": [2, 2]}
    mc.add_input({"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": False})
    assert len(cfg["input"]) == 2
    mc.add_input({"name": "C", "data_type": "TYPE_STRING", "dims": [1], "optional": True})
    assert cfg["input"][2]["optional"] is True
    assert len(cfg["input"]) == 3


def test_add_input_conflicts():
    cfg = _config(input=[{"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": False}])
    mc = pb_utils.ModelConfig(cfg)
    with pytest.raises(ValueError, match="datatype TYPE_FP32") as info:
        mc.add_input({"name": "B", "data_type": "TYPE_INT8", "dims": [4]})
    assert "'m'" in str(info.value) and "'B'" in str(info.value)
    with pytest.raises(ValueError, match="dims"):
        mc.add_input({"name": "B", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="optional"):
        mc.add_input({"name": "B", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    with pytest.raises(ValueError, match="contains property other than"):
        mc.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": "NCHW"})
    with pytest.raises(ValueError, match="missing 'name'"):
        mc.add_input({"data_type": "TYPE_FP32", "dims": [1]})
    with pytest.raises(ValueError, match="missing 'data_type'"):
        mc.add_input({"name": "X", "dims": [1]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        mc.add_input({"name": "X", "data_type": "TYPE_FP32"})
    assert len(cfg["input"]) == 1


def test_add_output():
    cfg = _config(output=[{"name": "O", "data_type": "TYPE_FP32", "dims": []}])
    mc = pb_utils.ModelConfig(cfg)
    mc.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [3]})
    assert cfg["output"][0]["dims"] == [3]
    mc.add_output({"name": "P", "data_type": "TYPE_BOOL", "dims": [1]})
    assert [o["name"] for o in cfg["output"]] == ["O", "P"]
    with pytest.raises(ValueError, match="contains property other than"):
        mc.add_output({"name": "Q", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="for output 'O'"):
        mc.add_output({"name": "O", "data_type": "TYPE_FP16", "dims": [3]})
    with pytest.raises(ValueError, match="dims"):
        mc.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [7]})


def test_add_input_creates_missing_list():
    mc = pb_utils.ModelConfig({"name": "bare"})
    mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [1]})
    assert mc.as_dict()["input"] == [{"name": "I", "data_type": "TYPE_FP32", "dims": [1]}]


def test_set_model_transaction_policy():
    mc = pb_utils.ModelConfig(_config())
    mc.set_model_transaction_policy({"decoupled": True})
    assert mc.as_dict()["model_transaction_policy"] == {"decoupled": True}
    assert pb_utils.using_decoupled_model_transaction_policy(mc.as_dict()) is True
    mc.set_model_transaction_policy({"decoupled": True})  # same value is fine
    with pytest.raises(ValueError, match="already set") as info:
        mc.set_model_transaction_policy({"decoupled": False})
    assert "'m'" in str(info.value)
    with pytest.raises(ValueError, match="other than 'decoupled'"):
        mc.set_model_transaction_policy({"streaming": True})


# ---------------------------------------------------------------------------- Logger


def test_logger_levels():
    assert pb_utils.Logger.INFO == 0
    assert pb_utils.Logger.WARNING == 1
    assert pb_utils.Logger.ERROR == 2
    assert pb_utils.Logger.VERBOSE == 3
    assert pb_utils.Logger.LogLevel.VERBOSE == 3


def test_logger_methods(caplog):
    with caplog.at_level(logging.DEBUG, logger="triton_actor.model"):
        pb_utils.Logger.log_info("info msg")
        pb_utils.Logger.log_warn("warn msg")
        pb_utils.Logger.log_error("error msg")
        pb_utils.Logger.log_verbose("verbose msg")
        pb_utils.Logger.log("default level")
        pb_utils.Logger.log("explicit error", pb_utils.Logger.ERROR)
        pb_utils.Logger.log("explicit verbose", level=pb_utils.Logger.VERBOSE)
    seen = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert seen == [
        ("triton_actor.model", logging.INFO, "info msg"),
        ("triton_actor.model", logging.WARNING, "warn msg"),
        ("triton_actor.model", logging.ERROR, "error msg"),
        ("triton_actor.model", logging.DEBUG, "verbose msg"),
        ("triton_actor.model", logging.INFO, "default level"),
        ("triton_actor.model", logging.ERROR, "explicit error"),
        ("triton_actor.model", logging.DEBUG, "explicit verbose"),
    ]
    # Records point at the model code that logged, not at pb_utils.
    assert all(r.pathname == __file__ for r in caplog.records)
    for bad in (17, 1, None):  # a plain int is no LogLevel for pybind11
        with pytest.raises(TypeError, match=r"^log\(\): incompatible function arguments") as info:
            pb_utils.Logger.log("x", bad)
        assert not isinstance(info.value, pb_utils.TritonModelException)
    for method in ("log_info", "log_warn", "log_error", "log_verbose"):
        with pytest.raises(TypeError, match=f"^{method}\\(\\): incompatible function arguments") as info:
            getattr(pb_utils.Logger, method)(None)
        assert str(info.value).endswith("Invoked with: None")


def test_logger_from_thread(caplog):
    finished = []

    def worker():
        pb_utils.Logger.log_info("from thread")
        pb_utils.Logger.log_warn("warn from thread")
        finished.append(True)

    with caplog.at_level(logging.INFO, logger="triton_actor.model"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(timeout=10)
    assert finished == [True]
    messages = {r.getMessage(): r for r in caplog.records}
    assert "from thread" in messages and "warn from thread" in messages
    assert messages["from thread"].thread != threading.get_ident()


# ---------------------------------------------------------------------------- metrics


def test_metric_kinds(metric_registry):
    assert (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE) == (0, 1)
    assert pb_utils.MetricFamily.HISTOGRAM == 2


def test_counter(metric_registry):
    family = pb_utils.MetricFamily("requests_total", "Requests", pb_utils.MetricFamily.COUNTER)
    assert metric_registry == [family]
    metric = family.Metric(labels={"model": "m"})
    assert metric.value() == 0.0
    metric.increment(2)
    metric.increment(0.5)
    assert metric.value() == 2.5
    with pytest.raises(pb_utils.TritonModelException):
        metric.increment(-1)
    with pytest.raises(pb_utils.TritonModelException):
        metric.set(5)
    with pytest.raises(pb_utils.TritonModelException):
        metric.observe(1)
    assert family.Metric(labels={"model": "m"}) is metric  # same labels: same series
    other = family.Metric(labels={"model": "n"})
    assert other is not metric and other.value() == 0.0
    assert family.Metric().value() == 0.0
    with pytest.raises(TypeError):
        metric.increment("1")


def test_gauge(metric_registry):
    family = pb_utils.MetricFamily("queue_depth", "Depth", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "1", "b": "2"})
    metric.set(10)
    metric.increment(-3)
    metric.increment(1.5)
    assert metric.value() == 8.5
    assert family.Metric(labels={"b": "2", "a": "1"}) is metric  # label order irrelevant


def test_histogram(metric_registry):
    family = pb_utils.MetricFamily("latency_s", "Latency", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException):
        family.Metric(labels={})
    with pytest.raises(ValueError):
        family.Metric(buckets=[1.0, 0.5])
    metric = family.Metric(labels={"m": "x"}, buckets=[0.1, 1.0, 10.0])
    for value in (0.05, 0.1, 0.5, 5.0, 50.0):
        metric.observe(value)
    assert metric._bucket_counts == [2, 1, 1, 1]
    assert metric._count == 5
    assert metric._sum == pytest.approx(55.65)
    with pytest.raises(pb_utils.TritonModelException):
        metric.value()
    with pytest.raises(pb_utils.TritonModelException):
        metric.increment(1)
    with pytest.raises(pb_utils.TritonModelException):
        metric.set(1)
    with pytest.raises(pb_utils.TritonModelException):
        family.Metric(labels={"m": "x"}, buckets=[1.0])


def test_metric_family_validation_and_registry(metric_registry):
    with pytest.raises(ValueError):
        pb_utils.MetricFamily("bad name", "d", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(ValueError):
        pb_utils.MetricFamily("ok_name", "d", 9)
    counter = pb_utils.MetricFamily("dup_total", "desc", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily("dup_total", "desc", pb_utils.MetricFamily.GAUGE)
    again = pb_utils.MetricFamily("dup_total", "desc", pb_utils.MetricFamily.COUNTER)
    counter.Metric(labels={"k": "v"}).increment(4)
    assert again.Metric(labels={"k": "v"}).value() == 4.0
    assert metric_registry == [counter]
    with pytest.raises(ValueError):
        counter.Metric(buckets=[1.0])
    with pytest.raises(TypeError):
        counter.Metric(labels={"k": 1})


# ---------------------------------------------------------------------------- model control


def test_model_control_without_hook(hooks):
    hooks.model_control = None
    with pytest.raises(pb_utils.TritonModelException, match="model control"):
        pb_utils.load_model("x")
    with pytest.raises(pb_utils.TritonModelException, match="model control"):
        pb_utils.unload_model("x")
    with pytest.raises(pb_utils.TritonModelException, match="model control"):
        pb_utils.is_model_ready("x")


def test_model_control_with_hook(hooks):
    calls = []

    class Control:
        def load_model(self, name, config, files):
            calls.append(("load", name, config, files))

        def unload_model(self, name, unload_dependents):
            calls.append(("unload", name, unload_dependents))

        def is_model_ready(self, name, version):
            calls.append(("ready", name, version))
            return name == "up"

    hooks.model_control = Control()
    pb_utils.load_model("a", config='{"backend": "python"}', files={"file:1/model.py": b"x"})
    pb_utils.unload_model("a", unload_dependents=True)
    assert pb_utils.is_model_ready("up", "1") is True
    assert pb_utils.is_model_ready("down") is False
    assert calls == [
        ("load", "a", '{"backend": "python"}', {"file:1/model.py": b"x"}),
        ("unload", "a", True),
        ("ready", "up", "1"),
        ("ready", "down", ""),
    ]


# ---------------------------------------------------------------------------- which server a call belongs to


def test_a_call_goes_to_the_server_whose_model_runs() -> None:
    """The context names the server; a thread without one gets the process's only installed server,
    and with two installed it is refused rather than sent to either."""
    a, b = serving.ServerHooks(model_control="a"), serving.ServerHooks(model_control="b")
    seen: list[object] = []

    def from_a_thread_of_the_model() -> None:
        try:
            seen.append(serving.current().model_control)
        except pb_utils.TritonModelException as e:
            seen.append(str(e))

    def in_a_thread() -> None:
        t = threading.Thread(target=from_a_thread_of_the_model)
        t.start()
        t.join()

    serving.install(a)
    try:
        with serving.using(b):
            assert serving.current() is b
        assert serving.current() is a
        in_a_thread()
        serving.install(b)
        with serving.using(a):
            assert serving.current() is a
        in_a_thread()
    finally:
        serving.uninstall(a)
        serving.uninstall(b)
    assert serving.current() is serving._UNSERVED
    assert seen[0] == "a"
    assert "2 servers run in this process" in seen[1]


def test_metric_families_of_two_servers_are_apart() -> None:
    a, b = serving.ServerHooks(), serving.ServerHooks()
    with serving.using(a):
        pb_utils.MetricFamily("apart", "d", pb_utils.MetricFamily.COUNTER).Metric().increment(2)
    with serving.using(b):
        pb_utils.MetricFamily("apart", "other description", pb_utils.MetricFamily.GAUGE).Metric().set(7)
    assert [(f._name, f._kind) for f in a.metrics.families] == [("apart", 0)]
    assert [(f._name, f._kind) for f in b.metrics.families] == [("apart", 1)]

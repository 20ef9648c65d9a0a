"""KServe V2 gRPC messages (sans-I/O, grpc_service.proto): decode requests, encode responses."""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferRequest, InferResponse
from triton_actor.protocol import bytes_codec
from triton_actor.protocol import v2_grpc as v2
from triton_actor.protocol._generated import grpc_service_pb2 as pb


def _raises(code: Code, msg: pb.ModelInferRequest) -> TritonError:
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(msg)
    assert info.value.code == code, repr(info.value)
    return info.value


@pytest.mark.parametrize(("datatype", "field", "values", "np_type"), [
    ("BOOL", "bool_contents", [True, False], np.bool_),
    ("INT8", "int_contents", [-3, 4], np.int8),
    ("INT32", "int_contents", [-3, 4], np.int32),
    ("INT64", "int64_contents", [-(2**40), 4], np.int64),
    ("UINT16", "uint_contents", [3, 65535], np.uint16),
    ("UINT64", "uint64_contents", [2**63, 1], np.uint64),
    ("FP32", "fp32_contents", [1.5, -2.0], np.float32),
    ("FP64", "fp64_contents", [1.25, -2.0], np.float64),
    ("BYTES", "bytes_contents", [b"ab", b""], np.object_),
])
def test_typed_contents(datatype: str, field: str, values: list, np_type: type) -> None:
    msg = pb.ModelInferRequest(model_name="m", model_version="2", id="x")
    getattr(msg.inputs.add(name="I", datatype=datatype, shape=[1, 2]).contents, field).extend(values)
    req = v2.decode_infer_request(msg)
    assert (req.model_name, req.model_version, req.id) == ("m", 2, "x")
    tensor = req.inputs["I"]
    assert tensor.shape == (1, 2) and tensor.data.dtype == np_type
    assert tensor.data.reshape(-1).tolist() == values


def test_raw_contents_are_zero_copy_views_and_bytes_are_length_prefixed() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP16", shape=[2])
    msg.inputs.add(name="S", datatype="BYTES", shape=[2])
    msg.raw_input_contents.extend([np.array([1, 2], np.float16).tobytes(),
                                   bytes_codec.serialize(np.array([b"x", b"yz"], dtype=np.object_))])
    req = v2.decode_infer_request(msg)
    assert req.model_version == -1
    assert req.inputs["A"].data.tolist() == [1, 2] and not req.inputs["A"].data.flags.writeable
    assert req.inputs["S"].data.tolist() == [b"x", b"yz"]


def test_bad_inputs() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP16", shape=[2]).contents.fp32_contents.extend([1, 2])
    assert "can only be sent in raw_input_contents" in str(_raises(Code.INVALID_ARG, msg))
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP32", shape=[2]).contents.int_contents.extend([1, 2])
    assert "must use 'contents.fp32_contents'" in str(_raises(Code.INVALID_ARG, msg))
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="S", datatype="BYTES", shape=[3]).contents.bytes_contents.extend([b"a"])
    assert "unexpected number of string elements 1" in str(_raises(Code.INVALID_ARG, msg))
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP32", shape=[-1])
    msg.raw_input_contents.append(b"")
    assert "invalid shape" in str(_raises(Code.INVALID_ARG, msg))
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FLOAT", shape=[1])
    assert "invalid datatype 'FLOAT'" in str(_raises(Code.INVALID_ARG, msg))
    msg = pb.ModelInferRequest(model_name="m", model_version="v1")
    assert "version string 'v1'" in str(_raises(Code.INVALID_ARG, msg))


def test_parameters() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["sequence_id"].string_param = "s1"
    msg.parameters["sequence_start"].bool_param = True
    msg.parameters["sequence_end"].bool_param = False
    msg.parameters["priority"].uint64_param = 3
    msg.parameters["timeout"].int64_param = 100
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    msg.parameters["custom"].double_param = 0.5
    req = v2.decode_infer_request(msg)
    assert (req.correlation_id, req.flags, req.priority, req.timeout_us) == ("s1", v2.SEQUENCE_START, 3, 100)
    assert req.parameters == {"custom": 0.5}
    for key, setter in (("sequence_start", "int64_param"), ("priority", "string_param"), ("custom", "uint64_param"),
                        ("sequence_id", "uint64_param"), ("sequence_id", "bool_param")):
        bad = pb.ModelInferRequest(model_name="m")
        setattr(bad.parameters[key], setter, 1 if setter != "string_param" else "1")
        _raises(Code.INVALID_ARG, bad)


def test_sequence_parameters_as_real_triton_reads_them() -> None:
    """Captured from Triton 2.51: a negative int64 id is the uint64 of its bits; a wrong type has no id prefix."""
    msg = pb.ModelInferRequest(model_name="m", id="r1")
    msg.parameters["sequence_id"].int64_param = -5
    assert v2.decode_infer_request(msg).correlation_id == 2**64 - 5
    msg.parameters["sequence_end"].string_param = "x"
    assert _raises(Code.INVALID_ARG, msg).message == "invalid value type for 'sequence_end' parameter, expected bool_param."


def test_requested_outputs_and_response_encoding() -> None:
    msg = pb.ModelInferRequest(model_name="m", id="r")
    msg.outputs.add(name="P").parameters["classification"].int64_param = 2
    msg.outputs.add(name="T")
    req = v2.decode_infer_request(msg)
    assert [(o.name, o.classification) for o in req.outputs] == [("P", 2), ("T", 0)]
    response = InferResponse([("P", np.array([0.1, 0.7, 0.2], np.float32)), ("skipped", np.zeros(1)),
                              ("T", np.array([b"a", b"bc"], dtype=np.object_))], {"flag": True, "n": 3})
    out = v2.encode_infer_response(req, response, 4, {}, batching=False)
    assert (out.model_name, out.model_version, out.id) == ("m", "4", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in out.outputs] == [("P", "BYTES", [2]), ("T", "BYTES", [2])]
    assert bytes_codec.deserialize(out.raw_output_contents[0], 2, "P").tolist() == [b"0.700000:1", b"0.200000:2"]
    assert out.parameters["flag"].bool_param is True and out.parameters["n"].int64_param == 3
    streamed = v2.stream_response(out)
    assert streamed.infer_response.parameters["triton_final_response"].bool_param is True


def test_all_outputs_when_none_requested() -> None:
    req = InferRequest("m", -1, "", {})
    out = v2.encode_infer_response(req, InferResponse([("Z", np.zeros((0, 2), np.int32))]), 1, {}, batching=True)
    assert list(out.outputs[0].shape) == [0, 2] and out.raw_output_contents == [b""]  # an entry even for 0 bytes


def test_repository_parameters() -> None:
    msg = pb.RepositoryModelLoadRequest(model_name="m")
    msg.parameters["config"].string_param = "{}"
    msg.parameters["file:1/model.py"].bytes_param = b"code"
    assert v2.repository_parameters(msg.parameters) == {"config": "{}", "file:1/model.py": b"code"}
    msg.parameters["config"].bool_param = True
    with pytest.raises(TritonError):
        v2.repository_parameters(msg.parameters)


def test_a_load_request_is_decoded_to_its_parameters_and_a_taken_buffer_emptied() -> None:
    """decode_load_request (issue 23): the message is dropped once its parameters are read, and a
    buffer handed over (a bytearray) is emptied; a request naming a repository keeps no parameters
    (it is refused on that name, as before, whatever they are)."""
    msg = pb.RepositoryModelLoadRequest(model_name="m")
    msg.parameters["config"].string_param = "{}"
    raw = bytearray(msg.SerializeToString())
    assert v2.decode_load_request(raw) == v2.LoadRequest("", "m", {"config": "{}"}) and raw == b""
    msg.repository_name = "r"
    msg.parameters["config"].bool_param = True  # not a string: refused only if it were read
    assert v2.decode_load_request(msg.SerializeToString()) == v2.LoadRequest("r", "m", {})


def test_a_request_with_more_inputs_than_the_model_is_refused_before_any_conversion() -> None:
    """As on HTTP (test_v2_http): the first unknown name is refused before any tensor is converted."""
    msg = pb.ModelInferRequest(model_name="m", id="r1")
    bad = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    bad.contents.fp32_contents.extend([1.0])  # one value for two elements: a conversion error
    for i in range(20):
        x = msg.inputs.add(name=f"x{i}", datatype="FP32", shape=[1])
        x.contents.fp32_contents.append(1.0)
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(msg, None, {"INPUT0", "INPUT1"})
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message == "[request id: r1] unexpected inference input 'x0' for model 'm'"
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(msg)
    assert "x0" not in info.value.message  # converted first: INPUT0's count is what fails


@pytest.mark.parametrize("wire", ["FP32", "INT8", "UINT64", "FP64", "BOOL"])
def test_typed_contents_in_slices_decode_as_in_one_call(wire: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SLICE elements, typed contents are converted a slice at a time: the same array."""
    field = {"FP32": "fp32_contents", "INT8": "int_contents", "UINT64": "uint64_contents",
             "FP64": "fp64_contents", "BOOL": "bool_contents"}[wire]
    values = [bool(i % 3) for i in range(1001)] if wire == "BOOL" else [i % 100 for i in range(1001)]
    msg = pb.ModelInferRequest(model_name="m")
    getattr(msg.inputs.add(name="x", datatype=wire, shape=[1001]).contents, field).extend(values)
    whole = v2.decode_infer_request(msg).inputs["x"].data
    monkeypatch.setattr(v2, "SLICE", 64)
    sliced = v2.decode_infer_request(msg).inputs["x"].data
    assert sliced.dtype == whole.dtype and sliced.tobytes() == whole.tobytes()
    assert v2.decode_work(msg) == 1001 + v2.ENTRY_WORK
    msg.raw_input_contents.append(b"")
    msg.parameters["k"].string_param = "v"
    assert v2.decode_work(msg) == 2 * v2.ENTRY_WORK

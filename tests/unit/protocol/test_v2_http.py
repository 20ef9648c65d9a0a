"""KServe V2 REST payloads with the binary extension and classification (sans-I/O; docs/protocols.md)."""

from __future__ import annotations

import struct
import warnings
from typing import Any

import numpy as np
import orjson
import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol import bytes_codec
from triton_actor.protocol import v2_http as v2
from triton_actor.protocol import v2_http_response as v2r
from triton_actor.protocol.classification import classify
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime import fastpath

FP32, FP16, INT64, BYTES = BY_WIRE["FP32"], BY_WIRE["FP16"], BY_WIRE["INT64"], BY_WIRE["BYTES"]
NO_ID = "[request id: <id_unknown>] "


def _json(header: dict[str, Any]) -> bytes:
    return orjson.dumps(header)


def _binary(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(blobs), len(head)


def _decode(body: bytes, header_length: int | None = None, model: str = "m") -> InferRequest:
    return v2.decode_infer_request(body, header_length, model, 1)


def _raises(code: Code, body: bytes, header_length: int | None = None) -> TritonError:
    with pytest.raises(TritonError) as info:
        _decode(body, header_length)
    assert info.value.code == code, repr(info.value)
    return info.value


def _fp32_input(name: str = "I", shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape or [2, 2], **extra}


# -- decoding: JSON --------------------------------------------------------------------------------


def test_decode_json_request() -> None:
    body = _json({
        "id": "42",
        "inputs": [
            _fp32_input("A", [2, 2], data=[[1, 2], [3, 4]]),  # nested
            {"name": "B", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},  # flat
            {"name": "C", "datatype": "BOOL", "shape": [1, 2], "data": [[True, False]]},
            {"name": "D", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
            {"name": "E", "datatype": "FP32", "shape": [2, 1, 2], "data": [[[1.5, 2]], [[3, 4]]]},
        ],
    })
    req = _decode(body, model="add_sub")
    assert (req.model_name, req.model_version, req.id) == ("add_sub", 1, "42")
    assert req.outputs is None and req.parameters == {} and req.binary_output is False
    a = req.inputs["A"]
    assert (a.name, a.dtype, a.shape) == ("A", FP32, (2, 2))
    assert a.data.dtype == np.float32
    np.testing.assert_array_equal(a.data, [[1, 2], [3, 4]])
    assert req.inputs["B"].data.dtype == np.int64
    np.testing.assert_array_equal(req.inputs["B"].data, [1, 2, 3])
    np.testing.assert_array_equal(req.inputs["C"].data, [[True, False]])
    d = req.inputs["D"].data
    assert d.dtype == object and list(d) == ["héllo".encode(), b""]
    assert req.inputs["E"].data.shape == (2, 1, 2)
    assert list(req.inputs) == ["A", "B", "C", "D", "E"]


def test_decode_json_data_count_mismatch_is_internal() -> None:
    err = _raises(Code.INTERNAL, _json({"inputs": [_fp32_input(data=[1, 2, 3])]}))
    assert "Unable to parse 'data': Shape does not match true shape of 'data' field" in err.message


def test_decode_json_wrong_element_types_are_internal() -> None:
    _raises(Code.INTERNAL, _json({"inputs": [_fp32_input(shape=[2], data=[1, "x"])]}))
    _raises(Code.INTERNAL, _json({"inputs": [{"name": "B", "datatype": "BOOL", "shape": [1], "data": [1]}]}))
    _raises(Code.INTERNAL, _json({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1], "data": [5]}]}))


@pytest.mark.parametrize("wire", ["FP16", "BF16"])
def test_decode_half_precision_via_json_is_rejected(wire: str) -> None:
    err = _raises(Code.INVALID_ARG, _json({"inputs": [{"name": "H", "datatype": wire, "shape": [1], "data": [1.0]}]}))
    assert err.message == (f"receiving {wire} data via JSON is not supported. "
                           "Please use the binary data format for input H")


def test_decode_malformed_json_is_internal() -> None:
    err = _raises(Code.INTERNAL, b'{"inputs":[{"name":"INPUT0",')
    assert "failed to parse the request JSON buffer" in err.message


def test_decode_missing_inputs_is_internal() -> None:
    err = _raises(Code.INTERNAL, b"{}")
    assert err.message == "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"


def test_decode_input_without_data_or_binary() -> None:
    err = _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input()]}))
    assert err.message.startswith("Input must set only one of the following fields")


def test_decode_bad_datatype_shape_and_duplicates() -> None:
    _raises(Code.INVALID_ARG, _json({"inputs": [{"name": "I", "datatype": "FLOAT", "shape": [1], "data": [1]}]}))
    # Triton's HTTP front end fails the JSON parse on a dimension that is not a non-negative integer (500) and
    # says which limit a shape passes (400): its L0_http http_test sends each
    unsigned = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    for shape in ([-4], [2, -5], [1.0], [True]):
        assert _raises(Code.INTERNAL, _json({"inputs": [_fp32_input(shape=shape, data=[1])]})).message == unsigned
    err = _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input(shape=[2**4, 2**60 + 2], data=[1])]}))
    assert err.message.endswith("invalid shape for input 'I': shape [16,1152921504606846978] causes total element "
                                "count to exceed maximum size of 9223372036854775807")
    err = _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input(shape=[2**2, 2**60 + 2], data=[1])]}))
    assert err.message.endswith("byte size overflow for input 'I': element count (4611686018427387912) * data type "
                                "size (4) exceeds maximum allowed size (9223372036854775807)")
    assert "invalid shape" in _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input(shape=7, data=[1])]})).message
    err = _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input(shape=[1], data=[1]),
                                                      _fp32_input(shape=[1], data=[2])]}))
    assert "'I'" in err.message and "already exists" in err.message


# -- decoding: binary extension --------------------------------------------------------------------


def test_decode_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.array([[7, 8, 9]], dtype=np.int64)
    body, hlen = _binary({"inputs": [
        _fp32_input("A", [2, 2], parameters={"binary_data_size": a.nbytes}),
        {"name": "J", "datatype": "INT64", "shape": [1], "data": [5]},  # JSON input in between
        {"name": "B", "datatype": "INT64", "shape": [1, 3], "parameters": {"binary_data_size": b.nbytes}},
    ]}, a.tobytes(), b.tobytes())
    req = _decode(body, hlen)
    whole = np.frombuffer(body, dtype=np.uint8)
    got_a, got_b = req.inputs["A"].data, req.inputs["B"].data
    np.testing.assert_array_equal(got_a, a.reshape(2, 2))
    np.testing.assert_array_equal(got_b, b)
    assert got_a.dtype == np.float32 and got_b.dtype == np.int64
    assert np.shares_memory(got_a, whole)
    assert np.shares_memory(got_b, whole)
    assert not got_a.flags.owndata and not got_b.flags.owndata
    np.testing.assert_array_equal(req.inputs["J"].data, [5])


def test_decode_binary_bytes_input() -> None:
    items = np.array([b"abc", b"", b"d\x00e"], dtype=object)
    raw = bytes_codec.serialize(items)
    assert raw == struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0) + struct.pack("<I", 3) + b"d\x00e"
    body, hlen = _binary({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [3, 1],
                                      "parameters": {"binary_data_size": len(raw)}}]}, raw)
    data = _decode(body, hlen).inputs["S"].data
    assert data.shape == (3, 1) and data.dtype == object
    assert list(data.reshape(-1)) == [b"abc", b"", b"d\x00e"]


def test_decode_binary_bytes_element_count_mismatch() -> None:
    raw = bytes_codec.serialize(np.array([b"a", b"b"], dtype=object))
    body, hlen = _binary({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [3],
                                      "parameters": {"binary_data_size": len(raw)}}]}, raw)
    _raises(Code.INVALID_ARG, body, hlen)
    truncated = struct.pack("<I", 10) + b"abc"
    body, hlen = _binary({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1],
                                      "parameters": {"binary_data_size": len(truncated)}}]}, truncated)
    _raises(Code.INVALID_ARG, body, hlen)


def test_decode_binary_byte_size_mismatch() -> None:
    body, hlen = _binary({"inputs": [_fp32_input("INPUT0", [4], parameters={"binary_data_size": 12})]}, bytes(12))
    err = _raises(Code.INVALID_ARG, body, hlen)
    assert err.message == (NO_ID + "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 12")


def test_decode_binary_size_larger_than_the_body() -> None:
    body, hlen = _binary({"inputs": [_fp32_input("INPUT1", [4], parameters={"binary_data_size": 16})]}, bytes(8))
    err = _raises(Code.INVALID_ARG, body, hlen)
    assert err.message == "unexpected size for input 'INPUT1', expecting 8 additional bytes for model 'm'"


def test_decode_trailing_bytes_after_the_last_input() -> None:
    body, hlen = _binary({"inputs": [_fp32_input("I", [1], parameters={"binary_data_size": 4})]}, bytes(4), b"junk")
    err = _raises(Code.INVALID_ARG, body, hlen)
    assert err.message == "unexpected additional input data for model 'm'"
    # ... also for a pure JSON header followed by stray bytes
    body, hlen = _binary({"inputs": [_fp32_input("I", [1], data=[1])]}, b"x")
    _raises(Code.INVALID_ARG, body, hlen)


def test_decode_header_length_larger_than_body() -> None:
    body = _json({"inputs": [_fp32_input("I", [1], data=[1])]})
    err = _raises(Code.INVALID_ARG, body, len(body) + 10)
    assert "inference header size should be in range" in err.message


def test_decode_binary_and_data_together_is_rejected() -> None:
    body, hlen = _binary({"inputs": [_fp32_input("I", [1], data=[1], parameters={"binary_data_size": 4})]},
                         bytes(4))
    _raises(Code.INVALID_ARG, body, hlen)


def test_parse_header_length() -> None:
    assert v2.parse_header_length(None) is None
    assert v2.parse_header_length("0") == 0
    assert v2.parse_header_length("123") == 123
    for bad in ("abc", "-1", "1.5", "", "+5", "1_0", "\u0661\u0662", "9" * 20):
        with pytest.raises(TritonError) as info:
            v2.parse_header_length(bad)
        assert info.value.code == Code.INVALID_ARG
        assert info.value.message == "Unable to parse Inference-Header-Content-Length"


# -- decoding: parameters and requested outputs ----------------------------------------------------


def test_request_parameters_forwarded_vs_consumed() -> None:
    req = _decode(_json({
        "inputs": [_fp32_input("I", [1], data=[1])],
        "parameters": {"sequence_id": 17, "sequence_start": True, "sequence_end": False, "priority": 2,
                       "timeout": 1500, "binary_data_output": True, "custom": "x", "n": 3, "f": 0.5,
                       "flag": False},
    }))
    assert req.parameters == {"custom": "x", "n": 3, "f": 0.5, "flag": False}
    assert req.correlation_id == 17
    assert req.flags == v2.SEQUENCE_START
    assert req.priority == 2
    assert req.timeout_us == 1500
    assert req.binary_output is True


def test_sequence_parameters_string_id_and_end_flag() -> None:
    req = _decode(_json({"inputs": [_fp32_input("I", [1], data=[1])],
                         "parameters": {"sequence_id": "abc", "sequence_start": True, "sequence_end": True}}))
    assert req.correlation_id == "abc"
    assert req.flags == v2.SEQUENCE_START | v2.SEQUENCE_END
    assert req.parameters == {}


def test_triton_prefixed_parameter_is_rejected() -> None:
    err = _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input("I", [1], data=[1])],
                                           "parameters": {"triton_x": 1}}))
    assert err.message == ("parameter keys starting with 'triton_' are reserved for Triton usage "
                           "and should not be specified.")


@pytest.mark.parametrize("params", [{"priority": -1}, {"timeout": "soon"}, {"binary_data_output": 1},
                                    {"custom": [1, 2]}, {"custom": {"a": 1}}])
def test_bad_parameter_values(params: dict[str, Any]) -> None:
    _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input("I", [1], data=[1])], "parameters": params}))


@pytest.mark.parametrize("params,text", [
    ({"sequence_id": True}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_id": -3}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_id": 1.5}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
    ({"sequence_end": "yes"}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
])
def test_bad_sequence_parameters_are_triton_parse_errors(params: dict[str, Any], text: str) -> None:
    """Real Triton 2.51's answers (HTTP 500, its JSON parser's words) for these sequence parameters."""
    err = _raises(Code.INTERNAL, _json({"inputs": [_fp32_input("I", [1], data=[1])], "parameters": params}))
    assert err.message == text


def test_requested_outputs() -> None:
    req = _decode(_json({
        "inputs": [_fp32_input("I", [1], data=[1])],
        "outputs": [{"name": "OUT0", "parameters": {"binary_data": True, "classification": 3}},
                    {"name": "OUT1", "parameters": {"binary_data": False}},
                    {"name": "OUT2"}],
    }))
    assert req.outputs == (RequestedOutput("OUT0", True, 3), RequestedOutput("OUT1", False, 0),
                           RequestedOutput("OUT2", None, 0))
    assert req.requested_output_names == ("OUT0", "OUT1", "OUT2")


@pytest.mark.parametrize("out", [{"name": "O", "parameters": {"binary_data": "yes"}},
                                 {"name": "O", "parameters": {"classification": -1}},
                                 {"name": "O", "parameters": {"classification": True}},
                                 {"parameters": {}}])
def test_bad_requested_outputs(out: dict[str, Any]) -> None:
    _raises(Code.INVALID_ARG, _json({"inputs": [_fp32_input("I", [1], data=[1])], "outputs": [out]}))


# -- encoding --------------------------------------------------------------------------------------


def _request(outputs: tuple[RequestedOutput, ...] | None = None, binary: bool = False, rid: str = "") -> InferRequest:
    x = np.zeros(4, dtype=np.float32)
    return InferRequest("add_sub", -1, rid, {"INPUT0": InferInput("INPUT0", FP32, (4,), x)}, outputs,
                        binary_output=binary)


SUM = np.array([1.5, 2, 3, 4], dtype=np.float32)
DIFF = np.array([-1, 0, 1, 2], dtype=np.int64)


def _encode(request: InferRequest, outputs: list[tuple[str, np.ndarray]], labels: dict[str, list[str]] | None = None,
            batching: bool = False, parameters: dict[str, Any] | None = None) -> tuple[list[bytes], int | None]:
    return v2r.encode_infer_response(request, InferResponse(outputs, parameters or {}), 3, labels or {}, batching)


def test_encode_json_outputs() -> None:
    chunks, hlen = _encode(_request(rid="req-1"), [("OUTPUT0", SUM), ("OUTPUT1", DIFF)], parameters={"p": 1})
    assert hlen is None and len(chunks) == 1
    assert orjson.loads(chunks[0]) == {
        "id": "req-1", "model_name": "add_sub", "model_version": "3", "parameters": {"p": 1},
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "data": [1.5, 2.0, 3.0, 4.0]},
                    {"name": "OUTPUT1", "datatype": "INT64", "shape": [4], "data": [-1, 0, 1, 2]}],
    }


def test_encode_omits_empty_id_and_parameters() -> None:
    chunks, _ = _encode(_request(), [("OUTPUT0", SUM)])
    head = orjson.loads(chunks[0])
    assert list(head) == ["model_name", "model_version", "outputs"]


def test_encode_binary_outputs_and_header_length() -> None:
    chunks, hlen = _encode(_request(binary=True), [("OUTPUT0", SUM), ("OUTPUT1", DIFF)])
    head = chunks[0]
    assert hlen == len(head)  # the Inference-Header-Content-Length value
    header = orjson.loads(head)
    assert header["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
        {"name": "OUTPUT1", "datatype": "INT64", "shape": [4], "parameters": {"binary_data_size": 32}},
    ]
    assert chunks[1:] == [SUM.tobytes(), DIFF.tobytes()]
    body = b"".join(chunks)
    np.testing.assert_array_equal(np.frombuffer(body[hlen:hlen + 16], np.float32), SUM)


def test_encode_per_output_binary_override_and_filtering() -> None:
    outputs = (RequestedOutput("OUTPUT1", binary=False), RequestedOutput("OUTPUT0"))
    chunks, hlen = _encode(_request(outputs, binary=True), [("OUTPUT0", SUM), ("OUTPUT1", DIFF), ("EXTRA", SUM)])
    header = orjson.loads(chunks[0])
    by_name = {o["name"]: o for o in header["outputs"]}
    assert set(by_name) == {"OUTPUT0", "OUTPUT1"}  # only what was asked for
    assert by_name["OUTPUT1"]["data"] == [-1, 0, 1, 2]  # per-output binary_data: false wins
    assert by_name["OUTPUT0"]["parameters"] == {"binary_data_size": 16}  # request default applies
    assert hlen == len(chunks[0]) and chunks[1:] == [SUM.tobytes()]
    # and the other way round: JSON by default, one output forced binary
    chunks, hlen = _encode(_request((RequestedOutput("OUTPUT1", binary=True),)), [("OUTPUT0", SUM), ("OUTPUT1", DIFF)])
    assert orjson.loads(chunks[0])["outputs"][0]["parameters"] == {"binary_data_size": 32}
    assert chunks[1:] == [DIFF.tobytes()]


def test_encode_bytes_outputs_both_ways() -> None:
    strings = np.array([b"ab", "ç".encode()], dtype=object)
    chunks, _ = _encode(_request(), [("S", strings)])
    assert orjson.loads(chunks[0])["outputs"] == [{"name": "S", "datatype": "BYTES", "shape": [2], "data": ["ab", "ç"]}]
    chunks, hlen = _encode(_request(binary=True), [("S", strings)])
    assert hlen == len(chunks[0])
    raw = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "ç".encode()
    assert orjson.loads(chunks[0])["outputs"][0]["parameters"] == {"binary_data_size": len(raw)}
    assert chunks[1:] == [raw]
    assert list(bytes_codec.deserialize(raw, 2, "S")) == [b"ab", "ç".encode()]


def test_encode_fp16_needs_binary() -> None:
    half = np.array([1, 2], dtype=np.float16)
    with pytest.raises(TritonError) as info:
        _encode(_request(), [("H", half)])
    assert info.value.code == Code.INVALID_ARG
    chunks, _ = _encode(_request(binary=True), [("H", half)])
    assert chunks[1:] == [half.tobytes()]


# -- classification --------------------------------------------------------------------------------


def test_classify_formats_like_triton() -> None:
    out = classify(np.array([1, 2, 3, 44], dtype=np.float32), 2, None, batching=False)
    assert out.shape == (2,) and list(out) == [b"44.000000:3", b"3.000000:2"]
    ints = classify(np.array([5, 10, 1], dtype=np.int32), 5, ["a", "b", "c"], batching=False)
    assert list(ints) == [b"10:1:b", b"5:0:a", b"1:2:c"]  # count capped at the element count


def test_encode_classification_with_labels() -> None:
    outputs = (RequestedOutput("OUTPUT0", binary=False, classification=2),)
    scores = np.array([1, 2, 3, 44], dtype=np.float32)
    labels = {"OUTPUT0": ["zero", "one", "two", "three"]}
    chunks, hlen = _encode(_request(outputs), [("OUTPUT0", scores)], labels=labels)
    assert hlen is None
    assert orjson.loads(chunks[0])["outputs"] == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2], "data": ["44.000000:3:three", "3.000000:2:two"]}]


def test_encode_batch_classification_shape() -> None:
    outputs = (RequestedOutput("OUTPUT0", binary=False, classification=2),)
    scores = np.array([[0.1, 0.9, 0.5], [3, 1, 2]], dtype=np.float32)
    chunks, _ = _encode(_request(outputs), [("OUTPUT0", scores)], batching=True)
    out = orjson.loads(chunks[0])["outputs"][0]
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [2, 2]
    assert out["data"] == ["0.900000:1", "0.500000:2", "3.000000:0", "2.000000:2"]


def test_encode_binary_classification() -> None:
    outputs = (RequestedOutput("OUTPUT0", binary=True, classification=1),)
    chunks, hlen = _encode(_request(outputs), [("OUTPUT0", np.array([3, 9, 1], dtype=np.int64))])
    assert hlen == len(chunks[0])
    out = orjson.loads(chunks[0])["outputs"][0]
    assert (out["datatype"], out["shape"]) == ("BYTES", [1])
    assert chunks[1:] == [struct.pack("<I", 3) + b"9:1"]


# -- raw binary requests (Inference-Header-Content-Length: 0) --------------------------------------


def test_decode_raw_request_fixed_shape() -> None:
    body = np.arange(4, dtype=np.float32).tobytes()
    req = v2.decode_raw_request(body, ("INPUT0", FP32, (4,), 0), "m", 2)
    t = req.inputs["INPUT0"]
    assert (req.model_name, req.model_version, req.binary_output, req.outputs) == ("m", 2, True, None)
    assert t.shape == (4,) and t.data.shape == (4,)
    np.testing.assert_array_equal(t.data, [0, 1, 2, 3])
    assert np.shares_memory(t.data, np.frombuffer(body, np.uint8))


def test_decode_raw_request_variable_dim_and_batching() -> None:
    body = np.arange(6, dtype=np.int64).tobytes()
    req = v2.decode_raw_request(body, ("X", INT64, (-1, 2), 8), "m", 1)
    t = req.inputs["X"]
    assert t.shape == (1, 3, 2) and t.data.shape == (1, 3, 2)
    np.testing.assert_array_equal(t.data.reshape(-1), np.arange(6))


def test_decode_raw_request_bytes() -> None:
    req = v2.decode_raw_request(b"raw text", ("T", BYTES, (1,), 0), "m", 1)
    t = req.inputs["T"]
    assert t.shape == (1,) and list(t.data) == [b"raw text"]
    batched = v2.decode_raw_request(b"x", ("T", BYTES, (1,), 4), "m", 1).inputs["T"]
    assert batched.shape == (1, 1)


@pytest.mark.parametrize(("body", "spec"), [
    (bytes(12), ("I", FP32, (4,), 0)),  # too short
    (bytes(7), ("I", FP32, (-1,), 0)),  # not a whole number of elements
    (bytes(16), ("I", FP32, (-1, -1), 0)),  # two variable dimensions
    (b"abc", ("T", BYTES, (2,), 0)),  # BYTES must be [1]
    (bytes(6), ("H", FP16, (-1, 2), 0)),  # 3 elements do not fill rows of 2
])
def test_decode_raw_request_errors(body: bytes, spec: tuple[str, Any, tuple[int, ...], int]) -> None:
    with pytest.raises(TritonError) as info:
        v2.decode_raw_request(body, spec, "m", 1)
    assert info.value.code == Code.INVALID_ARG


@pytest.mark.parametrize(("spec", "message"), [
    (("I", FP32, (-1, -1), 0), "The shape of the raw input 'I' can not be deduced because there are more than one "
                               "variable-sized dimension"),
    (("T", BYTES, (-1,), 8), "For BYTE datatype raw input 'T', the model must have input shape [1]"),
    (("T", BYTES, (2,), 0), "For BYTE datatype raw input 'T', the model must have input shape [1]"),
])
def test_decode_raw_request_refusals_in_triton_core_s_words(spec: tuple[str, Any, tuple[int, ...], int],
                                                             message: str) -> None:
    """Triton core's InferenceRequest::Normalize, as its L0_http http_test looks for them."""
    with pytest.raises(TritonError) as info:
        v2.decode_raw_request(b"427", spec, "m", 1)
    assert info.value.message == "[request id: <id_unknown>] " + message


def _binary_body(header: dict[str, Any], *arrays: np.ndarray) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(a.tobytes() for a in arrays), len(head)


def test_a_repeated_header_decodes_from_its_plan_with_fresh_data() -> None:
    header = {"id": "r1", "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
        {"name": "B", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}}],
        "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
        "parameters": {"priority": 2, "custom": "x"}}
    first = v2.decode_infer_request(*_binary_body(header, np.ones((2, 2), np.float32), np.arange(3)), "m", 1)
    body, hl = _binary_body(header, np.full((2, 2), 7, np.float32), np.arange(3) * 5)
    assert (body[:hl] in v2._PLANS) is fastpath.enabled  # a plan, unless fast paths are off
    second = v2.decode_infer_request(body, hl, "other", 3)
    assert (second.model_name, second.model_version, second.id, second.priority) == ("other", 3, "r1", 2)
    assert second.outputs == first.outputs and second.parameters == {"custom": "x"}
    assert second.parameters is not first.parameters
    assert second.inputs["A"].data.tolist() == [[7, 7], [7, 7]] and second.inputs["A"].shape == (2, 2)
    assert second.inputs["B"].data.tolist() == [0, 5, 10] and second.inputs["B"].dtype is BY_WIRE["INT64"]
    # the same header with a body of the wrong size still gets Triton's error
    with pytest.raises(TritonError, match="unexpected additional input data"):
        v2.decode_infer_request(body + b"xx", hl, "m", 1)
    with pytest.raises(TritonError, match="unexpected size for input 'B'"):
        v2.decode_infer_request(body[:-8], hl, "m", 1)


def test_headers_with_json_data_or_bytes_are_not_planned() -> None:
    header = {"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [3]}]}
    body = orjson.dumps(header)
    v2.decode_infer_request(body, len(body), "m", 1)
    assert body not in v2._PLANS
    header = {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]}
    body, hl = _binary_body(header, np.frombuffer(struct.pack("<I", 2) + b"hi", np.uint8))
    assert v2.decode_infer_request(body, hl, "m", 1).inputs["S"].data.tolist() == [b"hi"]
    assert body[:hl] not in v2._PLANS


def test_json_data_nested_deeper_than_any_tensor_is_a_clear_error() -> None:
    deep = "[" * 1000 + "1" + "]" * 1000
    body = ('{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":' + deep + "}]}").encode()
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(body, None, "m", 1)
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message.endswith("JSON nesting depth exceeds maximum allowed limit (100)")  # Triton's words
    deep_ok = "[" * 99 + "1" + "]" * 99  # Triton's limit: its http_test sends 50 (served) and 120 (refused)
    body = ('{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":' + deep_ok + "}]}").encode()
    assert v2.decode_infer_request(body, None, "m", 1).inputs["A"].data.tolist() == [1.0]
    shallow = b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2,1,2],"data":[[[1,2]],[[3,[4]]]]}]}'
    assert v2.decode_infer_request(shallow, None, "m", 1).inputs["A"].data.ravel().tolist() == [1, 2, 3, 4]


_FLAT_CASES = [
    ("FP32", [4], [1, 2.5, -3, 1e30]),
    ("INT8", [3], [1, 2, 300]),  # out of range
    ("UINT8", [2], [-1, 2]),
    ("INT64", [2], [2**62, -(2**62)]),
    ("FP64", [3], [1, True, 3]),  # a boolean among numbers
    ("INT32", [2], [1, "2"]),
    ("FP32", [2], [1, None]),
    ("FP32", [3], [1, 2]),  # too few
    ("FP32", [2, 2], [[1, 2], [3, 4]]),  # nested
    ("FP32", [0], []),
    ("INT16", [70000], list(range(-35000, 35000))),  # several slices, then an overflow
    ("FP32", [300000], [0.5] * 300000),
]


@pytest.mark.parametrize(("wire", "shape", "data"), _FLAT_CASES)
def test_flat_number_lists_decode_alike_with_and_without_the_fast_path(wire: str, shape: list[int], data: list[Any],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path (C loops over a flat list of JSON numbers, docs/security.md) answers as the general one."""
    monkeypatch.setattr(v2, "SLICE", 1 << 15)  # several slices in the long cases
    body = orjson.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": wire, "data": data}]})
    answers = []
    for enabled in (True, False):
        monkeypatch.setattr(fastpath, "enabled", enabled)
        try:
            array = v2.decode_infer_request(body, None, "m", -1).inputs["x"].data
            answers.append(("ok", array.dtype.str, array.shape, array.tobytes()))
        except TritonError as e:
            answers.append(("error", e.code, e.message))
    assert answers[0] == answers[1]


def test_a_boolean_binary_data_size_is_no_size() -> None:
    """JSON ``true`` passed the integer check (bool is an int subclass) and read one byte (fuzz review)."""
    header = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": True}}]})
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(header + b"\x07", len(header), "m", -1)
    assert info.value.code == Code.INVALID_ARG and "unexpected size for input 'x'" in info.value.message


@pytest.mark.parametrize("enabled", [True, False])
def test_json_numbers_beyond_fp32_become_infinities_as_in_triton(enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton stores a JSON double into an FP32 tensor with a C++ conversion: beyond FP32's range that
    gives +-inf. We answer alike, without numpy's overflow warning (an error under ``-W error``)."""
    monkeypatch.setattr(fastpath, "enabled", enabled)
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1e300, -1e300, 2.5]}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        array = v2.decode_infer_request(body, None, "m", -1).inputs["x"].data
    assert array.dtype == np.float32 and array.tolist() == [float("inf"), float("-inf"), 2.5]


def _many_inputs_with_a_bad_first(n: int) -> list[dict[str, Any]]:
    """INPUT0 with data that cannot be converted, then ``n`` inputs the model does not have."""
    bad = {"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.0, "x"]}
    return [bad] + [{"name": f"x{i}", "shape": [1], "datatype": "FP32", "data": [1.0]} for i in range(n)]


def test_a_request_with_more_inputs_than_the_model_is_refused_before_any_conversion() -> None:
    """400,000 one-element inputs cost 4.4 s of conversion before validation refused them.
    A request naming more inputs than the model has is refused at its first unknown name, before any
    tensor is converted (the bad data of INPUT0 is never looked at), with the validator's answer."""
    body = orjson.dumps({"id": "r1", "inputs": _many_inputs_with_a_bad_first(20)})
    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(body, None, "m", -1, None, {"INPUT0": None, "INPUT1": None})
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message == "[request id: r1] unexpected inference input 'x0' for model 'm'"
    with pytest.raises(TritonError) as info:  # without the names: converted first, INPUT0's data fails
        v2.decode_infer_request(body, None, "m", -1)
    assert "Unable to parse 'data'" in info.value.message


def test_few_inputs_are_not_looked_up() -> None:
    body = orjson.dumps({"inputs": _many_inputs_with_a_bad_first(v2.MANY_INPUTS - 1)})

    class Never:
        def __contains__(self, name: object) -> bool:
            raise AssertionError("looked up")

    with pytest.raises(TritonError) as info:
        v2.decode_infer_request(body, None, "m", -1, None, Never())
    assert "Unable to parse 'data'" in info.value.message


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint64", "int64", "bool"])
def test_big_json_outputs_in_slices_are_the_same_text(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SLICE elements a JSON output is written a slice at a time (fast path): the same bytes as
    the general path, NaN and infinities (null), -0.0 and FP32's doubles included."""
    rng = np.random.default_rng(3)
    if dtype == "bool":
        array = rng.random(1000) > 0.5
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, 1000, dtype=dtype, endpoint=True)
    else:
        array = (rng.standard_normal(1000) * 1e30).astype(dtype)
        array[:5] = [np.nan, np.inf, -np.inf, 0.1, -0.0]
    monkeypatch.setattr(v2, "SLICE", 64)
    request = InferRequest("m", 1, "", {}, None, {})
    texts = []
    for enabled in (True, False):
        monkeypatch.setattr(fastpath, "enabled", enabled)
        chunks, json_length = v2r.encode_infer_response(request, InferResponse([("y", array.reshape(10, 100))]), 1, {}, False)
        assert json_length is None
        texts.append(b"".join(chunks))
    assert texts[0] == texts[1] and orjson.loads(texts[0])["outputs"][0]["shape"] == [10, 100]
    assert v2r.json_output_elements(request, InferResponse([("y", array)]), {}, False) == 1000


@pytest.mark.parametrize(("array", "message"), [
    (np.array([[b"test"] * 8], dtype=np.object_), "class result not available for output due to unsupported type 'BYTES'"),
    (np.ones((1, 8), np.float16), "class result not available for output due to unsupported type 'FP16'"),
    (np.ones((1, 8), np.bool_), "class result not available for output due to unsupported type 'BOOL'"),
    (np.ones((1, 1_000_001), np.float32), "classification output tensor too large"),
])
def test_classification_refuses_what_triton_refuses(array: np.ndarray, message: str) -> None:
    """Triton's classification.cc, as its L0_parameters class_count_test asks for it: INVALID_ARG."""
    with pytest.raises(TritonError) as info:
        classify(array, 3, None, True)
    assert info.value.code == Code.INVALID_ARG and info.value.message == message
    assert classify(np.ones((1, 1_000_000), np.float32), 1, None, True).shape == (1, 1)  # the most it takes

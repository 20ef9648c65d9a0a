"""Properties of the KServe V2 gRPC codec (protocol/v2_grpc.py): ModelInferRequest ↔ InferRequest,
InferResponse → ModelInferResponse.

* a request built as the spec says — every tensor in ``raw_input_contents``, or every tensor in its
  typed ``contents`` field — decodes to the values it carries, parameters and requested outputs too;
* a response the server encodes, serialized and parsed again, carries the outputs the model gave
  (read by the spec and by tritonclient's ``InferResult``); built as bytes (a fast path), it is the
  same bytes;
* the decode plan of a repeated request (protocol/v2_grpc_plan.py) gives what the slow path gives, for
  good, mutated and arbitrary messages;
* any bytes (a protobuf DecodeError at the front end, or a message) and any message of arbitrary
  fields make a :class:`TritonError` or a request, never another exception.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec_strategies import (
    WIRES,
    Tensor,
    consumed_parameters,
    mutations,
    outputs,
    parameters,
    same_array,
    tensor_lists,
    text,
)
from triton_actor.errors import TritonError
from triton_actor.inference import InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol import bytes_codec
from triton_actor.protocol import v2_grpc as v2
from triton_actor.protocol import v2_grpc_plan as plan
from triton_actor.protocol._generated import grpc_service_pb2 as pb
from triton_actor.protocol.dtypes import BF16_NUMPY, BY_WIRE
from triton_actor.runtime import fastpath

# typed contents carry every datatype but FP16 and BF16 (raw only, grpc_service.proto)
TYPED_WIRES = tuple(w for w in WIRES if w not in ("FP16", "BF16"))


def encode_request(inputs: list[Tensor], raw: bool, rid: str, params: dict[str, Any],
                   outs: list[Any] | None) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="3", id=rid)
    for t in inputs:
        entry = msg.inputs.add(name=t.name, datatype=t.wire, shape=t.shape)
        if raw:
            msg.raw_input_contents.append(bytes_codec.serialize(t.array) if t.wire == "BYTES" else t.array.tobytes())
        else:
            values = t.array.reshape(-1).tolist()
            getattr(entry.contents, v2._CONTENTS_FIELD[t.wire]).extend(values)
    v2.set_parameters(msg.parameters, params)
    for o in outs or ():
        out = msg.outputs.add(name=o.name)
        if o.classification:
            out.parameters["classification"].int64_param = o.classification
    return msg


@given(st.booleans(), st.data())
def test_request_round_trip(raw: bool, data: st.DataObject) -> None:
    inputs = data.draw(tensor_lists(WIRES if raw else TYPED_WIRES))
    rid, params = data.draw(text), data.draw(parameters)
    consumed, outs = data.draw(consumed_parameters()), data.draw(outputs)
    msg = encode_request(inputs, raw, rid, {**params, **consumed}, outs)
    got = v2.decode_infer_request(pb.ModelInferRequest.FromString(msg.SerializeToString()))
    assert (got.model_name, got.model_version, got.id) == ("m", 3, rid)
    assert list(got.inputs) == [t.name for t in inputs]
    for t in inputs:
        tensor = got.inputs[t.name]
        assert (tensor.dtype, tensor.shape) == (BY_WIRE[t.wire], t.shape)
        assert same_array(tensor.data, t.array), t
    assert got.outputs == (None if not outs else tuple(RequestedOutput(o.name, None, o.classification) for o in outs))
    flags = (v2.SEQUENCE_START if consumed.get("sequence_start") else 0) | \
        (v2.SEQUENCE_END if consumed.get("sequence_end") else 0)
    assert (got.parameters, got.priority, got.timeout_us, got.correlation_id, got.flags) == (
        params, consumed.get("priority", 0), consumed.get("timeout", 0), consumed.get("sequence_id", 0), flags)


def decode_response(msg: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """The spec's reading: output i's bytes are ``raw_output_contents[i]``."""
    assert len(msg.raw_output_contents) == len(msg.outputs)
    result = {}
    for out, raw in zip(msg.outputs, msg.raw_output_contents, strict=True):
        shape = tuple(out.shape)
        if out.datatype == "BYTES":
            result[out.name] = bytes_codec.deserialize(raw, None, "output").reshape(shape)
        else:
            np_dtype = BF16_NUMPY if out.datatype == "BF16" else BY_WIRE[out.datatype].numpy
            result[out.name] = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    return result


@given(tensor_lists(WIRES), st.data())
def test_response_round_trip(produced: list[Tensor], data: st.DataObject) -> None:
    names = [t.name for t in produced]
    asked = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(names), unique=True) if names else st.just([])))
    specs = None if asked is None else tuple(RequestedOutput(n) for n in asked)
    rid = data.draw(text)
    request = InferRequest("m", -1, rid, {}, specs)
    response = InferResponse([(t.name, t.array) for t in produced], data.draw(parameters))
    msg = pb.ModelInferResponse.FromString(
        v2.encode_infer_response(request, response, 5, {}, False).SerializeToString())
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "5", rid)
    assert {k: v2.oneof_value(p) for k, p in msg.parameters.items()} == response.parameters
    selected = [t for t in produced if asked is None or t.name in asked]
    assert [o.name for o in msg.outputs] == [t.name for t in selected]
    result = decode_response(msg)
    for t in selected:
        assert same_array(result[t.name], t.array), t
    _check_with_tritonclient(msg, selected)


@given(tensor_lists(WIRES), st.data())
def test_the_response_built_as_bytes_is_the_message_serialized(produced: list[Tensor], data: st.DataObject) -> None:
    """The answer the HTTP/2 reader sends (a fast path, ``encode_infer_response_bytes``) is the bytes of
    the message the slow path builds, or None where it leaves the answer to it."""
    names = [t.name for t in produced]
    asked = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(names), unique=True) if names else st.just([])))
    request = InferRequest(data.draw(text), -1, data.draw(text), {},
                           None if asked is None else tuple(RequestedOutput(n) for n in asked))
    response = InferResponse([(t.name, t.array) for t in produced], data.draw(st.one_of(st.just({}), parameters)))
    for _ in range(2):  # the second from the kept heads
        got = v2.encode_infer_response_bytes(request, response, 7, {}, False)
        want = v2.encode_infer_response(request, response, 7, {}, False).SerializeToString()
        selected = [t for t in produced if asked is None or t.name in asked]
        if response.parameters or any(t.wire == "BYTES" for t in selected):
            assert got is None
        else:
            assert got == want


def _check_with_tritonclient(msg: pb.ModelInferResponse, selected: list[Tensor]) -> None:
    from tritonclient.grpc import InferResult
    from tritonclient.grpc import service_pb2 as client_pb

    result = InferResult(client_pb.ModelInferResponse.FromString(msg.SerializeToString()))
    for t in selected:
        if t.wire == "BF16":
            continue  # tritonclient widens BF16 to float32
        got = result.as_numpy(t.name)
        assert got is not None and got.shape == t.shape
        if t.wire == "BYTES":
            assert [bytes(x) for x in got.reshape(-1)] == list(t.array.reshape(-1))
        else:
            assert got.tobytes() == t.array.tobytes()


# -- anything else is a TritonError (or, for bytes that are no message, protobuf's DecodeError) ------
def _decodes_or_refuses(payload: bytes) -> None:
    try:
        msg = pb.ModelInferRequest.FromString(payload)
    except DecodeError:
        return  # the front end answers INTERNAL "Unable to parse request" (grpc_calls.py)
    try:
        v2.decode_infer_request(msg)
    except TritonError:
        pass


@given(st.binary(max_size=256))
def test_any_bytes_are_refused_cleanly(payload: bytes) -> None:
    _decodes_or_refuses(payload)


@given(st.booleans(), st.data())
def test_mutated_requests_are_refused_cleanly(raw: bool, data: st.DataObject) -> None:
    inputs = data.draw(tensor_lists(WIRES if raw else TYPED_WIRES, max_size=3))
    msg = encode_request(inputs, raw, data.draw(text), data.draw(consumed_parameters()), data.draw(outputs))
    _decodes_or_refuses(data.draw(mutations(msg.SerializeToString())))


_INT64 = st.one_of(st.integers(-3, 4), st.integers(-(2**63), 2**63 - 1))
_CONTENTS = {
    "bool_contents": st.lists(st.booleans(), max_size=4),
    "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4),
    "int64_contents": st.lists(_INT64, max_size=4),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=4),
    "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=4),
    "fp32_contents": st.lists(st.floats(width=32), max_size=4),
    "fp64_contents": st.lists(st.floats(), max_size=4),
    "bytes_contents": st.lists(st.binary(max_size=4), max_size=4),
}
_PARAM_KINDS = {"bool_param": st.booleans(), "int64_param": _INT64, "string_param": text,
                "double_param": st.floats(), "uint64_param": st.integers(0, 2**64 - 1)}
_PARAM_KEYS = st.one_of(text, st.sampled_from(["sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                              "classification", "shared_memory_region", v2.EMPTY_FINAL_RESPONSE,
                                              "triton_x", "binary_data_output"]))


@st.composite
def _fill_parameters(draw: st.DrawFn, target: Any) -> None:
    for key in draw(st.lists(_PARAM_KEYS, max_size=3)):
        kind = draw(st.sampled_from(sorted(_PARAM_KINDS)))
        setattr(target[key], kind, draw(_PARAM_KINDS[kind]))


@st.composite
def messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    """Messages of arbitrary fields: any datatype text, int64 dims (huge, negative, zero), any typed
    contents field for any datatype, raw contents of any length, any parameter of any kind."""
    msg = pb.ModelInferRequest(model_name=draw(text), model_version=draw(st.one_of(
        text, st.sampled_from(["1", "0", "-1", "²", "\u0661", "99999999999999999999"]))), id=draw(text))
    for _ in range(draw(st.integers(0, 3))):
        entry = msg.inputs.add(name=draw(st.sampled_from(["a", "b", ""])),
                               datatype=draw(st.one_of(st.sampled_from(WIRES), text)),
                               shape=draw(st.lists(st.one_of(st.integers(0, 3), _INT64), max_size=4)))
        for field in draw(st.lists(st.sampled_from(sorted(_CONTENTS)), max_size=2)):
            getattr(entry.contents, field).extend(draw(_CONTENTS[field]))
        draw(_fill_parameters(entry.parameters))
    msg.raw_input_contents.extend(draw(st.lists(st.binary(max_size=24), max_size=3)))
    draw(_fill_parameters(msg.parameters))
    for name in draw(st.lists(text, max_size=2)):
        draw(_fill_parameters(msg.outputs.add(name=name).parameters))
    return msg


@given(st.sampled_from(TYPED_WIRES), st.data())
def test_typed_contents_of_the_whole_field_range(wire: str, data: st.DataObject) -> None:
    """A typed field is wider than its narrower datatypes (``int_contents`` is int32 for INT8 and
    INT16, ``uint_contents`` uint32 for UINT8 and UINT16): each element keeps its low bytes, as
    Triton's copy does. Found by this property: 256 in ``uint_contents`` for UINT8 raised numpy's
    OverflowError out of the decoder."""
    field = v2._CONTENTS_FIELD[wire]
    values = data.draw(_CONTENTS[field].filter(bool))
    msg = pb.ModelInferRequest(model_name="m")
    getattr(msg.inputs.add(name="I", datatype=wire, shape=[len(values)]).contents, field).extend(values)
    got = v2.decode_infer_request(msg).inputs["I"].data
    if wire == "BYTES":
        assert got.tolist() == values
        return
    width = {"int_contents": "<i4", "uint_contents": "<u4"}.get(field)
    if width is None:  # as wide as the datatype: the values themselves (NaN payloads too)
        assert got.tobytes() == np.array(list(getattr(msg.inputs[0].contents, field)), dtype=got.dtype).tobytes()
    else:  # the low bytes of each little-endian element
        low = np.frombuffer(np.array(values, dtype=width).tobytes(), dtype=np.uint8).reshape(len(values), 4)
        assert got.tobytes() == low[:, :got.dtype.itemsize].tobytes()


@pytest.mark.parametrize(("wire", "values", "expected"), [
    ("UINT8", [256, 257, 255], [0, 1, 255]), ("INT8", [128, -129], [-128, 127]), ("UINT16", [65536 + 7], [7]),
    ("INT16", [32768], [-32768]),
])
def test_typed_contents_past_the_datatype_wrap_as_triton(wire: str, values: list[int], expected: list[int]) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    getattr(msg.inputs.add(name="I", datatype=wire, shape=[len(values)]).contents, v2._CONTENTS_FIELD[wire]).extend(values)
    assert v2.decode_infer_request(msg).inputs["I"].data.tolist() == expected


@settings(max_examples=150)
@given(messages())
def test_arbitrary_messages_are_refused_cleanly(msg: pb.ModelInferRequest) -> None:
    try:
        v2.decode_infer_request(msg)
    except TritonError:
        pass


@given(st.one_of(text, st.sampled_from(["²", "\u0661\u0662", "+1", " 1", "1_0", "0x1"])))
def test_version_strings(text_: str) -> None:
    try:
        version = v2.parse_version(text_)
    except TritonError:
        return
    assert version == -1 if not text_ else text_.isascii() and int(text_) == version


@pytest.mark.parametrize("value", ["²", "³", "\u0661", "\u0661\u0662"])
def test_non_ascii_digit_version_is_invalid_arg(value: str) -> None:
    """Found by the properties: '²'.isdigit() is True but int('²') raised ValueError out of the decoder;
    '\\u0661' (ARABIC-INDIC ONE) decoded as version 1. Triton's std::stol takes ASCII digits only."""
    with pytest.raises(TritonError):
        v2.parse_version(value)


# -- the decode plan (protocol/v2_grpc_plan.py) answers as the slow path does --------------------------
def _slow(payload: bytes) -> Any:
    """What the specification makes of a ModelInfer message's bytes: a request, an error, or no message."""
    try:
        msg = pb.ModelInferRequest.FromString(payload)
    except DecodeError:
        return "no message"
    try:
        return v2.decode_infer_request(msg)
    except TritonError as e:
        return e.code, e.message


def _through_plan(payload: bytes) -> Any:
    """The same through ``parse_infer`` (what the ModelInfer method parses with): a message it hands on
    is decoded by the slow path, as the servicer does."""
    try:
        got = plan.parse_infer(payload)
    except DecodeError:
        return "no message"
    if type(got) is plan.Planned:
        assert (got.model_name, got.version) == (got.request.model_name, got.request.model_version)
        return got.request
    try:
        return v2.decode_infer_request(got)
    except TritonError as e:
        return e.code, e.message


def _agree(payload: bytes) -> None:
    want, got = _slow(payload), _through_plan(payload)
    if not isinstance(want, InferRequest):
        assert got == want
        return
    assert isinstance(got, InferRequest)
    assert got._replace(inputs={}) == want._replace(inputs={})
    assert list(got.inputs) == list(want.inputs)
    for name, tensor in want.inputs.items():
        assert (got.inputs[name].dtype, got.inputs[name].shape) == (tensor.dtype, tensor.shape)
        assert same_array(got.inputs[name].data, tensor.data), name


def _fresh_data(msg: pb.ModelInferRequest, seed: int) -> bytes:
    """``msg`` with other bytes of the same sizes in its raw contents (BYTES tensors keep theirs)."""
    other = pb.ModelInferRequest()
    other.CopyFrom(msg)
    rng = np.random.default_rng(seed)
    for i, t in enumerate(msg.inputs):
        if t.datatype != "BYTES":
            other.raw_input_contents[i] = rng.bytes(len(msg.raw_input_contents[i]))
    return other.SerializeToString()


@given(st.data())
def test_the_plan_and_the_slow_path_agree_on_repeated_requests(data: st.DataObject) -> None:
    """Every datatype and shape in raw contents, with ids, parameters and requested outputs: the same
    header sent again with other data decodes (from the plan) to the request the slow path gives."""
    inputs = data.draw(tensor_lists(WIRES))
    msg = encode_request(inputs, True, data.draw(text), {**data.draw(parameters), **data.draw(consumed_parameters())},
                         data.draw(outputs))
    for seed in range(3):
        _agree(msg.SerializeToString() if seed == 0 else _fresh_data(msg, seed))


@given(st.data())
def test_the_plan_and_the_slow_path_agree_on_mutated_requests(data: st.DataObject) -> None:
    """A plan kept for a good request, then near-valid bytes (a flipped byte keeps the length the plans
    are kept by): the same request, error or parse failure either way."""
    inputs = data.draw(tensor_lists(WIRES, max_size=3))
    msg = encode_request(inputs, True, data.draw(text), data.draw(consumed_parameters()), data.draw(outputs))
    good = msg.SerializeToString()
    _agree(good)
    _agree(data.draw(mutations(good)))


@settings(max_examples=150)
@given(messages())
def test_the_plan_and_the_slow_path_agree_on_arbitrary_messages(msg: pb.ModelInferRequest) -> None:
    payload = msg.SerializeToString()
    for _ in range(2):
        _agree(payload)


def _add_sub(model: str = "m", names: tuple[str, str] = ("INPUT0", "INPUT1")) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model)
    for name in names:
        msg.inputs.add(name=name, datatype="FP32", shape=[2, 2])
    msg.raw_input_contents.extend([np.arange(4, dtype=np.float32).tobytes()] * 2)
    return msg


def test_a_repeated_message_decodes_from_its_plan_into_views_of_its_own_bytes() -> None:
    first = _add_sub().SerializeToString()
    assert type(plan.parse_infer(first)) is (plan.Planned if fastpath.enabled else pb.ModelInferRequest)
    again = _fresh_data(_add_sub(), 1)
    got = plan.parse_infer(again)
    if not fastpath.enabled:  # the slow path: always the message
        assert type(got) is pb.ModelInferRequest and not plan._PLANS
        return
    assert type(got) is plan.Planned and plan._PLANS.get(len(again)) is not None
    tensor = got.request.inputs["INPUT1"].data
    assert tensor.base.base is again and tensor.shape == (2, 2)  # a view of the bytes (reshaped)
    assert tensor.tobytes() == pb.ModelInferRequest.FromString(again).raw_input_contents[1]
    # same length, another input's name: not the plan's request
    lookalike = _add_sub(names=("INPUT0", "INPUT9")).SerializeToString()
    assert len(lookalike) == len(again)
    assert list(plan.parse_infer(lookalike).request.inputs) == ["INPUT0", "INPUT9"]


def _unplanned_messages() -> list[tuple[str, bytes]]:
    shm = _add_sub()
    shm.inputs[0].parameters["shared_memory_region"].string_param = "r"
    typed = _add_sub()
    del typed.raw_input_contents[:]
    typed.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    strings = pb.ModelInferRequest(model_name="m")
    strings.inputs.add(name="S", datatype="BYTES", shape=[1])
    strings.raw_input_contents.append(bytes_codec.serialize(np.array([b"ab"], dtype=np.object_)))
    many = pb.ModelInferRequest(model_name="m")
    for i in range(v2.MANY_INPUTS + 1):
        many.inputs.add(name=f"I{i}", datatype="INT8", shape=[1])
        many.raw_input_contents.append(b"\x01")
    out_shm = _add_sub()
    out_shm.outputs.add(name="O").parameters["shared_memory_region"].string_param = "r"
    # a field after the raw contents (a writer that does not keep field order): parsed, not planned
    after = _add_sub().SerializeToString() + pb.ModelInferRequest(id="x").SerializeToString()
    return [("input in shared memory", shm.SerializeToString()), ("typed contents", typed.SerializeToString()),
            ("BYTES", strings.SerializeToString()), ("many inputs", many.SerializeToString()),
            ("output to shared memory", out_shm.SerializeToString()), ("field after raw contents", after)]


@pytest.mark.parametrize(("case", "payload"), _unplanned_messages(), ids=[c for c, _ in _unplanned_messages()])
def test_messages_the_plan_does_not_cover_keep_no_plan(case: str, payload: bytes) -> None:
    plan._PLANS.clear()
    for _ in range(2):
        got = plan.parse_infer(payload)
        assert not plan._PLANS, case
        if case != "field after raw contents":  # left whole to the slow path: the servicer reads the message
            assert type(got) is pb.ModelInferRequest, case
    _agree(payload)

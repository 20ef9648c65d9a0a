"""Properties of the KServe V2 REST codec (protocol/v2_http.py) and the BYTES layout (bytes_codec.py).

* a request encoded as the spec says (JSON data, the binary extension, or a mix) decodes to the values
  encoded, with the header-plan cache (a repeated header) and without it;
* a response the server encodes decodes, in the spec's reading and in tritonclient's, to the outputs
  the model gave (every Triton datatype, binary or JSON as asked);
* any bytes, near-valid bodies and headers of arbitrary JSON make a :class:`TritonError` or a request,
  never another exception.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.http import InferenceServerClient

from tests.unit.codec_strategies import (
    JSON_WIRES,
    WIRES,
    Tensor,
    arrays,
    byte_strings,
    consumed_parameters,
    mutations,
    outputs,
    parameters,
    same_array,
    shapes,
    tensor_lists,
    text,
)
from triton_actor.errors import TritonError
from triton_actor.inference import InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol import bytes_codec
from triton_actor.protocol import v2_http as v2
from triton_actor.protocol import v2_http_response as v2r
from triton_actor.protocol.dtypes import BF16_NUMPY, BY_WIRE


# -- the spec's encoding, in test form ------------------------------------------------------------
def _json_data(t: Tensor, nested: bool) -> Any:
    flat = t.array.reshape(-1)
    items = [x.decode("utf-8") for x in flat] if t.wire == "BYTES" else flat.tolist()
    if not nested or not t.shape:
        return items
    return np.array(items, dtype=object).reshape(t.shape).tolist() if items else items


def _raw(t: Tensor) -> bytes:
    return bytes_codec.serialize(t.array) if t.wire == "BYTES" else t.array.tobytes()


def encode_request(inputs: list[tuple[Tensor, bool, bool]], rid: str, params: dict[str, Any],
                   outs: list[Any] | None) -> tuple[bytes, int | None]:
    """(tensor, binary, nested) per input → the body and its Inference-Header-Content-Length."""
    header: dict[str, Any] = {"id": rid} if rid else {}
    entries, blobs = [], []
    for t, binary, nested in inputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.wire, "shape": list(t.shape)}
        if binary:
            blob = _raw(t)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(t, nested)
        entries.append(entry)
    header["inputs"] = entries
    if params:
        header["parameters"] = params
    if outs is not None:
        header["outputs"] = [_output_entry(o) for o in outs]
    head = orjson.dumps(header)
    return (head + b"".join(blobs), len(head)) if blobs else (head, None)


def _output_entry(o: Any) -> dict[str, Any]:
    p: dict[str, Any] = {}
    if o.binary is not None:
        p["binary_data"] = o.binary
    if o.classification:
        p["classification"] = o.classification
    return {"name": o.name, "parameters": p} if p else {"name": o.name}


def _expected_fields(params: dict[str, Any], consumed: dict[str, Any]) -> dict[str, Any]:
    flags = (v2.SEQUENCE_START if consumed.get("sequence_start") else 0) | \
        (v2.SEQUENCE_END if consumed.get("sequence_end") else 0)
    return {"parameters": params, "priority": consumed.get("priority", 0), "timeout_us": consumed.get("timeout", 0),
            "correlation_id": consumed.get("sequence_id", 0), "flags": flags}


def check_request(got: InferRequest, inputs: list[Tensor], rid: str, fields: dict[str, Any],
                  outs: list[Any] | None, binary_output: bool) -> None:
    assert (got.model_name, got.model_version, got.id) == ("m", 3, rid)
    assert list(got.inputs) == [t.name for t in inputs]
    for t in inputs:
        tensor = got.inputs[t.name]
        assert (tensor.name, tensor.dtype, tensor.shape) == (t.name, BY_WIRE[t.wire], t.shape)
        assert same_array(tensor.data, t.array), (t, tensor)
    want_outs = None if outs is None else tuple(RequestedOutput(o.name, o.binary, o.classification) for o in outs)
    assert got.outputs == want_outs
    assert got.binary_output is binary_output
    assert {k: getattr(got, k) for k in fields} == fields


# -- requests: decode ∘ encode = id ---------------------------------------------------------------
@given(tensor_lists(JSON_WIRES, finite=True, utf8=True), st.data())
def test_json_request_round_trip(inputs: list[Tensor], data: st.DataObject) -> None:
    nested = [data.draw(st.booleans()) for _ in inputs]
    rid, params = data.draw(text), data.draw(parameters)
    consumed, outs = data.draw(consumed_parameters()), data.draw(outputs)
    binary_output = data.draw(st.one_of(st.none(), st.booleans()))
    all_params = {**params, **consumed} | ({} if binary_output is None else {"binary_data_output": binary_output})
    body, length = encode_request([(t, False, n) for t, n in zip(inputs, nested, strict=True)], rid, all_params, outs)
    assert length is None
    got = v2.decode_infer_request(body, None, "m", 3)
    check_request(got, inputs, rid, _expected_fields(params, consumed), outs, bool(binary_output))


@pytest.mark.usefixtures("fast_paths")
@given(tensor_lists(WIRES), st.data())
def test_binary_request_round_trip(inputs: list[Tensor], data: st.DataObject) -> None:
    """Every datatype in the binary extension (BF16, FP16, non-UTF-8 BYTES, NaN payloads), mixed
    with JSON where JSON can carry the values; decoded twice, so a repeated header takes the plan."""
    mixed = []
    for t in inputs:
        json_ok = t.wire in JSON_WIRES and (t.wire != "BYTES" or _utf8(t.array)) and _finite(t.array)
        mixed.append((t, not json_ok or data.draw(st.booleans()), data.draw(st.booleans())))
    rid, params, outs = data.draw(text), data.draw(parameters), data.draw(outputs)
    body, length = encode_request(mixed, rid, params, outs)
    for _ in range(2):
        got = v2.decode_infer_request(body, length, "m", 3)
        check_request(got, inputs, rid, _expected_fields(params, {}), outs, False)


def _utf8(array: np.ndarray) -> bool:
    try:
        [x.decode("utf-8") for x in array.reshape(-1)]
    except UnicodeDecodeError:
        return False
    return True


def _finite(array: np.ndarray) -> bool:
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


@settings(max_examples=100)
@given(tensor_lists(tuple(w for w in JSON_WIRES if w != "BOOL" and w != "BYTES"), finite=True, utf8=True,
                    max_size=3), st.booleans(), text)
def test_tritonclient_request_decodes(inputs: list[Tensor], binary: bool, rid: str) -> None:
    """The official client's encoding (``generate_request_body``) decodes to what it was given."""
    from tritonclient.http import InferInput

    client_inputs = []
    for t in inputs:
        i = InferInput(t.name, list(t.shape), t.wire)
        i.set_data_from_numpy(t.array, binary_data=binary)
        client_inputs.append(i)
    body, length = InferenceServerClient.generate_request_body(client_inputs, request_id=rid)
    got = v2.decode_infer_request(body, length, "m", 3)
    assert got.binary_output is True  # the client asks for binary outputs when it names none
    for t in inputs:
        assert same_array(got.inputs[t.name].data, t.array)


# -- responses -------------------------------------------------------------------------------------
def decode_response(chunks: list[bytes], length: int | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The spec's reading of a response: the JSON header, then each binary output's bytes in order."""
    body = b"".join(chunks)
    header = orjson.loads(body[:length] if length is not None else body)
    offset = length or len(body)
    result = {}
    for out in header["outputs"]:
        wire, shape = out["datatype"], tuple(out["shape"])
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = out["data"]
            result[out["name"]] = (np.array([x.encode() for x in data], dtype=object) if wire == "BYTES"
                                   else np.array(data, dtype=BY_WIRE[wire].numpy)).reshape(shape)
            continue
        raw = body[offset:offset + size]
        offset += size
        if wire == "BYTES":
            result[out["name"]] = bytes_codec.deserialize(raw, None, "output").reshape(shape)
        else:
            np_dtype = BF16_NUMPY if wire == "BF16" else BY_WIRE[wire].numpy
            result[out["name"]] = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    assert offset == len(body)
    return header, result


@settings(max_examples=100)
@pytest.mark.usefixtures("fast_paths")
@given(tensor_lists(WIRES), st.data())
def test_response_round_trip(produced: list[Tensor], data: st.DataObject) -> None:
    """What the model gave comes back to the client: the requested outputs in the model's order,
    binary or JSON as asked (JSON FP16/BF16 is refused, as Triton refuses it); tritonclient reads
    the same values."""
    default_binary = data.draw(st.booleans())
    names = [t.name for t in produced]
    asked = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(names), unique=True) if names else st.just([])))
    specs = None if asked is None else tuple(RequestedOutput(n, data.draw(st.one_of(st.none(), st.booleans())))
                                             for n in asked)
    rid = data.draw(text)
    request = InferRequest("m", -1, rid, {}, specs, {}, binary_output=default_binary)
    response = InferResponse([(t.name, t.array) for t in produced], data.draw(parameters))
    wanted = {s.name: s for s in specs} if specs is not None else None
    selected = [t for t in produced if wanted is None or t.name in wanted]

    def binary_of(t: Tensor) -> bool:
        spec = None if wanted is None else wanted[t.name]
        return default_binary if spec is None or spec.binary is None else spec.binary

    json_sent = [t for t in selected if not binary_of(t)]
    if any(t.wire in ("FP16", "BF16") for t in json_sent):
        with pytest.raises(TritonError, match="via JSON is not supported"):
            v2r.encode_infer_response(request, response, 7, {}, False)
        return
    chunks, length = v2r.encode_infer_response(request, response, 7, {}, False)
    header, result = decode_response(chunks, length)
    assert header.get("id", "") == rid and header["model_name"] == "m" and header["model_version"] == "7"
    assert header.get("parameters", {}) == response.parameters
    assert [o["name"] for o in header["outputs"]] == [t.name for t in selected]
    wants = {t.name: _as_sent(t, binary_of(t)) for t in selected}
    for t in selected:
        if t.array.dtype.kind == "f" and not binary_of(t):
            assert np.array_equal(result[t.name], wants[t.name], equal_nan=True)
        else:
            assert same_array(result[t.name], wants[t.name]), t
    _check_with_tritonclient(b"".join(chunks), length, selected, wants)


def _as_sent(t: Tensor, binary: bool) -> np.ndarray:
    """What a JSON output can carry: invalid UTF-8 in BYTES is replaced (as Triton's writer does) and
    JSON has no NaN or infinity (orjson writes null, read back as NaN)."""
    if binary:
        return t.array
    if t.wire == "BYTES":
        return np.array([x.decode("utf-8", "replace").encode() for x in t.array.reshape(-1)],
                        dtype=object).reshape(t.shape)
    if t.array.dtype.kind == "f":
        return np.where(np.isfinite(t.array), t.array, np.nan).astype(t.array.dtype)
    return t.array


def _check_with_tritonclient(body: bytes, length: int | None, selected: list[Tensor],
                             wants: dict[str, np.ndarray]) -> None:
    result = InferenceServerClient.parse_response_body(body, header_length=length)
    for t in selected:
        if t.wire == "BF16":
            continue  # tritonclient reads BF16 as 4-byte floats: it has no 2-byte numpy type
        got = result.as_numpy(t.name)
        assert got is not None and got.shape == t.shape
        if t.wire != "BYTES":
            assert np.array_equal(got, wants[t.name], equal_nan=True)


# -- BYTES layout ----------------------------------------------------------------------------------
@given(st.lists(byte_strings, max_size=8))
def test_bytes_codec_round_trip(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    raw = bytes_codec.serialize(array)
    assert len(raw) == bytes_codec.byte_size(array)
    assert bytes_codec.deserialize(raw, len(items), "t").tolist() == items
    assert bytes_codec.deserialize(raw, None, "t").tolist() == items


@given(st.binary(max_size=64), st.one_of(st.none(), st.integers(0, 8)))
def test_bytes_codec_any_bytes(raw: bytes, count: int | None) -> None:
    try:
        out = bytes_codec.deserialize(raw, count, "t")
    except TritonError:
        return
    assert count is None or len(out) == count
    assert bytes_codec.serialize(out) == raw


# -- anything else is a TritonError -----------------------------------------------------------------
def _decodes_or_refuses(body: bytes, length: int | None) -> None:
    try:
        v2.decode_infer_request(body, length, "m", 1)
    except TritonError:
        pass


@given(st.binary(max_size=256), st.one_of(st.none(), st.integers(0, 300)))
def test_any_bytes_are_refused_cleanly(body: bytes, length: int | None) -> None:
    _decodes_or_refuses(body, length)


@settings(max_examples=100)
@given(tensor_lists(WIRES, max_size=3), st.data())
def test_mutated_requests_are_refused_cleanly(inputs: list[Tensor], data: st.DataObject) -> None:
    body, length = encode_request([(t, True, False) for t in inputs], "", {}, None)
    mutated = data.draw(mutations(body))
    _decodes_or_refuses(mutated, length if length is None else data.draw(st.sampled_from([length, length - 1])))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False,
              allow_infinity=False), text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
_KEYS = ("name", "datatype", "shape", "data", "parameters", "binary_data_size", "binary_data", "classification",
         "shared_memory_region", "sequence_id", "priority", "outputs", "inputs", "id")


@st.composite
def json_headers(draw: st.DrawFn) -> dict[str, Any]:
    """Headers whose fields hold any JSON (shapes of huge or zero dimensions, data of every kind),
    their keys drawn from the names the decoder reads."""
    def obj() -> st.SearchStrategy[dict[str, Any]]:
        return st.dictionaries(st.sampled_from(_KEYS), st.one_of(json_values, st.sampled_from(WIRES)), max_size=5)

    tensor = st.fixed_dictionaries(
        {"name": text, "datatype": st.sampled_from(WIRES),
         "shape": st.lists(st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1)), max_size=4)},
        optional={"data": json_values, "parameters": st.one_of(obj(), json_values)})
    header = draw(st.fixed_dictionaries({"inputs": st.lists(st.one_of(tensor, obj()), max_size=3)},
                                        optional={"id": json_values, "parameters": st.one_of(obj(), json_values),
                                                  "outputs": st.one_of(st.lists(obj(), max_size=2), json_values)}))
    return header


@settings(max_examples=80)
@given(json_headers(), st.binary(max_size=32))
def test_json_headers_are_refused_cleanly(header: dict[str, Any], blob: bytes) -> None:
    head = orjson.dumps(header)
    _decodes_or_refuses(head, None)
    _decodes_or_refuses(head + blob, len(head))


config_dims = st.lists(st.one_of(st.just(-1), st.integers(1, 4)), max_size=3)  # what config.py lets through


zero_size_shapes = st.lists(st.one_of(st.integers(0, 3), st.integers(2**31, 2**64 - 1)), min_size=1, max_size=4).map(
    lambda dims: [0, *dims])


@given(st.sampled_from(WIRES), st.permutations(range(5)), zero_size_shapes, st.booleans())
def test_zero_size_tensors(wire: str, order: list[int], shape: list[int], binary: bool) -> None:
    """A shape with a zero dimension holds no elements whatever its other dimensions: an empty
    tensor of that shape, or a TritonError where numpy cannot hold the shape."""
    shape = [shape[i] for i in order if i < len(shape)]
    entry: dict[str, Any] = {"name": "I", "datatype": wire, "shape": shape}
    if binary:
        entry["parameters"] = {"binary_data_size": 0}
    else:
        entry["data"] = []
    head = orjson.dumps({"inputs": [entry]})
    try:
        got = v2.decode_infer_request(head, len(head) if binary else None, "m", 1)
    except TritonError:
        return
    assert got.inputs["I"].data.shape == tuple(shape) and got.inputs["I"].data.size == 0


@given(st.sampled_from(WIRES), config_dims, st.integers(0, 4), st.binary(max_size=40))
def test_raw_binary_requests(wire: str, dims: list[int], max_batch: int, body: bytes) -> None:
    """``Inference-Header-Content-Length: 0``: the body is the only input, or a TritonError. (Dims
    come from a model config, whose validation refuses any dimension but -1 and >= 1.)"""
    try:
        got = v2.decode_raw_request(body, ("I", BY_WIRE[wire], tuple(dims), max_batch), "m", 1)
    except TritonError:
        return
    tensor = got.inputs["I"]
    raw = bytes_codec.serialize(tensor.data) if wire == "BYTES" else tensor.data.tobytes()
    assert raw == (bytes_codec.serialize(np.array([body], dtype=object)) if wire == "BYTES" else body)


@given(st.one_of(st.none(), text))
def test_header_length_values(value: str | None) -> None:
    try:
        n = v2.parse_header_length(value)
    except TritonError:
        return
    assert n is None or n >= 0


@given(st.sampled_from(WIRES), shapes, st.data())
def test_tensor_from_bytes_matches_the_array(wire: str, shape: list[int], data: st.DataObject) -> None:
    array = data.draw(arrays(wire, tuple(shape)))
    raw = bytes_codec.serialize(array) if wire == "BYTES" else array.tobytes()
    got = v2.tensor_from_bytes(raw, BY_WIRE[wire], tuple(shape), array.size, "I", "m", "")
    assert same_array(got, array)


@pytest.mark.parametrize("shape", [[0, 2**31, 2**32], [2**62, 0], [0, 2**64 - 1]])
@pytest.mark.parametrize("binary", [True, False])
def test_empty_shape_too_large_for_numpy_is_invalid_arg(shape: list[int], binary: bool) -> None:
    """Found by test_zero_size_tensors: a 0 dimension beside dimensions whose product numpy cannot
    hold raised numpy's ValueError ("array is too big") out of the decoder, on both transports."""
    entry: dict[str, Any] = {"name": "I", "datatype": "BOOL", "shape": shape}
    entry.update({"parameters": {"binary_data_size": 0}} if binary else {"data": []})
    head = orjson.dumps({"inputs": [entry]})
    with pytest.raises(TritonError, match="invalid shape"):
        v2.decode_infer_request(head, len(head) if binary else None, "m", 1)
    if shape[-1] < 2**63:
        from triton_actor.protocol import v2_grpc
        from triton_actor.protocol._generated import grpc_service_pb2 as pb

        msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b""])
        msg.inputs.add(name="I", datatype="BOOL", shape=shape)
        with pytest.raises(TritonError, match="invalid shape"):
            v2_grpc.decode_infer_request(msg)

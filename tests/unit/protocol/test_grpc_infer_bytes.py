"""A ModelInferRequest's bytes without its id (protocol/grpc_infer_bytes.py), read without decoding: what is
left parses to the same message with no id, and the name, version and id are protobuf's own reading."""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor.protocol._generated import grpc_service_pb2 as pb
from triton_actor.protocol.grpc_infer_bytes import split_head, split_id


def _message(rid: str, *, version: str = "", size: int = 4, name: str = "add_sub") -> pb.ModelInferRequest:
    m = pb.ModelInferRequest(model_name=name, model_version=version, id=rid)
    m.parameters["priority"].int64_param = 3
    for n in ("INPUT0", "INPUT1"):
        t = m.inputs.add(name=n, datatype="FP32", shape=[size])
        t.parameters["binary_data_size"].int64_param = size * 4
        m.raw_input_contents.append(np.arange(size, dtype=np.float32).tobytes())
    m.outputs.add(name="OUTPUT0")
    return m


@pytest.mark.parametrize("message", [
    _message("r-1"), _message(""), _message("é" * 200, version="7"), _message("x", size=5000),
    _message("", name="m" * 300), pb.ModelInferRequest(), pb.ModelInferRequest(id="only"),
])
def test_the_rest_parses_to_the_message_without_its_id(message: pb.ModelInferRequest) -> None:
    data = message.SerializeToString()
    split = split_id(data)
    assert split is not None
    rest, name, version, rid = split
    assert (name.decode(), version.decode(), rid.decode()) == (message.model_name, message.model_version, message.id)
    expected = pb.ModelInferRequest()
    expected.CopyFrom(message)
    expected.ClearField("id")
    assert pb.ModelInferRequest.FromString(rest) == expected
    assert rest == expected.SerializeToString()  # two requests that differ in their id only: the same rest


def test_fields_in_any_order_give_the_same_rest() -> None:
    """Protobuf reads fields in any order; the id put first (as another client may) is cut out as well."""
    message = _message("abc")
    id_first = pb.ModelInferRequest(id="abc").SerializeToString() + _message("").SerializeToString()
    assert pb.ModelInferRequest.FromString(id_first) == message
    split = split_id(id_first)
    assert split is not None and split[0] == _message("").SerializeToString() and split[3] == b"abc"


@pytest.mark.parametrize("data", [
    pb.ModelInferRequest(id="a").SerializeToString() * 2,  # the id twice: protobuf takes the last
    pb.ModelInferRequest(model_name="a").SerializeToString() * 2,
    pb.ModelInferRequest(model_version="1").SerializeToString() * 2,
    b"\x08\x01",  # a varint field: no field of ModelInferRequest is one
    _message("r").SerializeToString()[:-1],  # truncated
    b"\x1a\xff\xff\xff\xff\xff\x01",  # a length past any message
    b"\x82\x01\x00",  # a field number past 15
])
def test_anything_else_is_left_to_the_regular_decode(data: bytes) -> None:
    assert split_id(data) is None


@pytest.mark.parametrize("message", [
    _message("r-1"), _message(""), _message("r", version="7"), _message("x", size=5000), pb.ModelInferRequest(),
    pb.ModelInferRequest(id="only"),
])
def test_the_head_of_a_serialized_message_is_split_as_the_whole(message: pb.ModelInferRequest) -> None:
    """What every serializer writes (fields in number order, short name and id): the head alone gives
    split_id's answer."""
    data = message.SerializeToString()
    assert split_head(data) == split_id(data)


_ODD = [
    pb.ModelInferRequest(id="a").SerializeToString() * 2,  # the id twice
    pb.ModelInferRequest(model_name="a").SerializeToString() + pb.ModelInferRequest(model_name="b").SerializeToString(),
    _message("").SerializeToString() + pb.ModelInferRequest(id="late").SerializeToString(),  # an id after the inputs
    _message("r").SerializeToString() + pb.ModelInferRequest(model_name="other").SerializeToString(),
    _message("r").SerializeToString() + pb.ModelInferRequest(model_version="9").SerializeToString(),
    pb.ModelInferRequest(id="abc").SerializeToString() + _message("").SerializeToString(),  # the id first
]


@pytest.mark.parametrize("data", _ODD)
def test_a_head_split_that_split_id_could_have_given_decodes_as_it_says(data: bytes) -> None:
    """A head split is looked up among split_id's answers (rests that split to themselves): when its rest
    is one, the message is that rest with the head's id put in, and the head's name and version are the
    message's; otherwise no lookup of it can find anything."""
    head = split_head(data)
    assert head is not None
    rest, name, version, rid = head
    whole = split_id(rest)
    if whole is None or whole[0] != rest:
        return  # never among what was remembered
    message, expected = pb.ModelInferRequest.FromString(data), pb.ModelInferRequest.FromString(rest)
    expected.id = rid.decode()
    assert message == expected
    assert name.decode() == message.model_name and version.decode() in ("", message.model_version)


def test_odd_messages_include_ones_whose_head_rest_is_not_a_remembered_rest() -> None:
    """The cases above reach both branches (a test that checks nothing would pass too)."""
    looked = [split_id(split_head(d)[0]) for d in _ODD]
    assert any(w is None or w[0] != split_head(d)[0] for w, d in zip(looked, _ODD, strict=True))
    assert any(w is not None and w[0] == split_head(d)[0] for w, d in zip(looked, _ODD, strict=True))


@pytest.mark.parametrize("data", [b"\x0a\x80\x01" + b"m" * 128, _message("r").SerializeToString()[:3], b"\x1a\x05ab"])
def test_a_long_or_truncated_head_is_left_to_split_id(data: bytes) -> None:
    assert split_head(data) is None

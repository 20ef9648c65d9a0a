"""gRPC response-cache hits answered by a ModelInferRequest's bytes (frontends/cached_answers.py's
``grpc_again``, read by their head, ``protocol/grpc_infer_bytes.py``'s ``split_head``), through a real
server and a raw gRPC channel that sends the bytes made here: a hit's answer is the miss's, byte for
byte, but for the id; the id is always the one protobuf reads from the message, also when a field the
head does not read (an id or a name after the inputs) is in the bytes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from triton_actor.frontends.grpc import GrpcServicer
from triton_actor.frontends.grpc_methods import method_table
from triton_actor.protocol._generated import grpc_service_pb2 as pb

from .test_response_cache import Start, _repo, _stats

INFER = "/inference.GRPCInferenceService/ModelInfer"


def _message(rid: str, outputs: bool, params: bool) -> pb.ModelInferRequest:
    m = pb.ModelInferRequest(model_name="cached", id=rid)
    m.inputs.add(name="INPUT0", datatype="FP32", shape=[3])
    m.raw_input_contents.append(np.arange(3, dtype=np.float32).tobytes())
    if outputs:
        m.outputs.add(name="OUTPUT0")
    if params:
        m.parameters["priority"].int64_param = 1
    return m


def _without_id(answer: bytes) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse.FromString(answer)
    message.ClearField("id")
    return message


@pytest.mark.parametrize(("outputs", "params"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.timeout(120)
def test_a_hit_by_bytes_is_the_miss_with_its_own_id(tmp_path: Path, start_server: Start, outputs: bool,
                                                     params: bool) -> None:
    server = start_server(_repo(tmp_path), flags=("--cache-config", "local,size=1048576"))
    channel = grpc.insecure_channel(server.grpc_url)
    call: Any = channel.unary_unary(INFER)  # bytes in, bytes out
    try:
        first = _message("a", outputs, params).SerializeToString()
        miss = call(first, timeout=30)
        assert pb.ModelInferResponse.FromString(miss).id == "a"
        assert call(first, timeout=30) == miss  # the same bytes: the same answer
        for rid in ("", "b", "é" * 40):
            answer = call(_message(rid, outputs, params).SerializeToString(), timeout=30)
            assert pb.ModelInferResponse.FromString(answer).id == rid
            assert _without_id(answer) == _without_id(miss)
        late_id = _message("", outputs, params).SerializeToString() + pb.ModelInferRequest(id="late").SerializeToString()
        answer = call(late_id, timeout=30)
        assert pb.ModelInferResponse.FromString(answer).id == "late"  # protobuf's reading: the last id
        assert _without_id(answer) == _without_id(miss)
        again = first + pb.ModelInferRequest(id="last").SerializeToString()  # an id before the inputs and one after
        assert pb.ModelInferResponse.FromString(call(again, timeout=30)).id == "last"
        stats = _stats(server)
        assert (stats["hit"], stats["miss"]) == (6, 1)
    finally:
        channel.close()


@pytest.mark.parametrize("caching", [False, True])
def test_model_infer_takes_the_whole_message_path_with_or_without_a_cache(caching: bool) -> None:
    """A message whole in its DATA frame skips the call's buffer on a server with a response cache too
    (its lookup reads the message itself); without a cache there is no lookup to call."""
    servicer = GrpcServicer(SimpleNamespace(runtime=None), caching=caching)  # type: ignore[arg-type]
    infer = method_table(servicer)[INFER.encode()]
    assert infer.whole
    assert (infer.again is not None) is caching

"""What the HTTP path keeps for a repeating client (issue 25, point 3): a request that came whole in one
read (``http1.ServerConnection.receive_whole``), a planned request decode (``v2_http.decode_planned``) and
a planned answer (``v2_http_response.encode_planned``) give exactly what the regular path gives, and
anything else goes the regular way. Each test runs with fast paths on and off."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest

from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol import http1
from triton_actor.protocol import v2_http as v2
from triton_actor.protocol import v2_http_response as v2r
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.protocol.http1 import BodyTooLarge, Limits
from triton_actor.runtime import fastpath

pytestmark = pytest.mark.usefixtures("fast_paths")

LIMITS = Limits(max_body=1000)
HEAD = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"
REQUEST = HEAD + b"hello world"


def _regular(data: bytes, limits: Limits = LIMITS) -> tuple[http1.ServerConnection, list[object]]:
    conn = http1.ServerConnection(limits, now=0.0)
    conn.receive_data(data, 1.0)
    return conn, [conn.next_event(), conn.next_event()]


def _state(conn: http1.ServerConnection) -> tuple[object, ...]:
    return conn.state, bytes(conn.buf), conn.deadline, conn.want, conn._last


def test_a_request_whole_in_one_read_is_what_the_regular_path_reads() -> None:
    regular, (head, body) = _regular(REQUEST)  # the regular path keeps the parsed head (fast paths on)
    conn = http1.ServerConnection(LIMITS, now=0.0)
    whole = conn.receive_whole(REQUEST, 1.0)
    if not fastpath.enabled:
        assert whole is None and _state(conn) == _state(http1.ServerConnection(LIMITS, now=0.0))
        return
    assert whole == (head, body.data)
    assert _state(conn) == _state(regular) and conn.deadline == math.inf  # answering: no read timeout
    conn.start_next_cycle(2.0)  # and the connection goes on as after the regular path
    assert conn.receive_whole(REQUEST, 3.0) == (head, b"hello world")


@pytest.mark.parametrize("data", [
    REQUEST + REQUEST,  # pipelined: the regular path reads both
    REQUEST[:-1],  # the body has not all come
    HEAD[:-4] + b"x",  # a kept head and one more byte, no blank line: not a request yet
    HEAD[:-4] + b"\r\n\r",
    b"\r\n" + REQUEST,  # an empty line first (ignored by the regular path)
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"",
])
def test_anything_else_is_left_to_the_regular_path(data: bytes) -> None:
    _regular(REQUEST)
    _regular(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")  # a kept chunked head
    conn = http1.ServerConnection(LIMITS, now=0.0)
    assert conn.receive_whole(data, 1.0) is None
    assert _state(conn) == _state(http1.ServerConnection(LIMITS, now=0.0))  # nothing consumed


def test_a_kept_head_over_this_connection_s_body_limit_is_refused_the_regular_way() -> None:
    _regular(REQUEST)  # kept by a server whose limit allows it
    small = Limits(max_body=5)
    conn = http1.ServerConnection(small, now=0.0)
    assert conn.receive_whole(REQUEST, 1.0) is None
    conn.receive_data(REQUEST, 1.0)
    with pytest.raises(BodyTooLarge):
        conn.next_event()


FP32 = BY_WIRE["FP32"]
SUM = np.array([1.5, 2, 3, 4], dtype=np.float32)
DIFF = np.array([-1, 0, 1, 2], dtype=np.int64)


def _request(outputs: tuple[RequestedOutput, ...] | None, binary: bool, rid: str) -> InferRequest:
    x = np.zeros(4, dtype=np.float32)
    return InferRequest("add_sub", -1, rid, {"INPUT0": InferInput("INPUT0", FP32, (4,), x)}, outputs,
                        binary_output=binary)


_OUTPUTS = [
    (None, True),
    (None, False),
    ((RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1")), True),
    ((RequestedOutput("OUTPUT1", binary=True),), False),
    ((RequestedOutput("OUTPUT1", binary=False), RequestedOutput("OUTPUT0")), True),
    ((RequestedOutput("OUTPUT0", classification=2),), True),
    ((RequestedOutput("OUTPUT0", shm=("region", 0, 16)),), True),
    ((RequestedOutput("NOT_THERE"),), True),
]


@pytest.mark.parametrize(("outputs", "binary"), _OUTPUTS)
@pytest.mark.parametrize("rid", ["", "req-1", "x" * 300])
def test_a_planned_answer_is_the_general_encoder_s(outputs: tuple[RequestedOutput, ...] | None, binary: bool,
                                                   rid: str) -> None:
    request, on = _request(outputs, binary, rid), fastpath.enabled
    for arrays in ([("OUTPUT0", SUM), ("OUTPUT1", DIFF)], [("OUTPUT0", SUM[:3]), ("OUTPUT1", DIFF)],
                   [("OUTPUT0", SUM), ("OUTPUT1", DIFF.astype(np.int32))], [("OUTPUT1", DIFF), ("OUTPUT0", SUM)]):
        response = InferResponse(arrays)
        expected: Any = None
        if _plannable(outputs, binary, rid) or not any(o.shm for o in outputs or ()):  # (shm: no region here)
            fastpath.set_enabled(False)  # the specification
            expected = v2r.encode_infer_response(request, response, 3, {"OUTPUT0": ["a", "b"]}, False)
            fastpath.set_enabled(on)
            assert v2r.encode_infer_response(request, response, 3, {"OUTPUT0": ["a", "b"]}, False) == expected
        planned = v2r.encode_planned(request, response, 3)  # after the regular encoder planned it
        assert planned == (expected if on and _plannable(outputs, binary, rid) else None)
        if planned is not None:
            assert orjson.loads(planned[0][0])["model_version"] == "3"
            assert v2r.encode_planned(request, InferResponse(arrays, {"p": 1}), 3) is None  # parameters: JSON
            assert v2r.encode_planned(request, response, 4) is None  # another version: another header


def _plannable(outputs: tuple[RequestedOutput, ...] | None, binary: bool, rid: str) -> bool:
    """Every output the answer carries is binary, none classified or in shared memory, and there is one."""
    carried = [RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1")] if outputs is None else \
        [o for o in outputs if o.name != "NOT_THERE"]
    return len(rid) <= 256 and bool(carried) and all(
        not o.classification and o.shm is None and (binary if o.binary is None else o.binary) for o in carried)


def _body(rid: str = "r") -> tuple[bytes, int]:
    header = {"id": rid, "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
        {"name": "B", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}}],
        "outputs": [{"name": "Y", "parameters": {"binary_data": True}}], "parameters": {"custom": 1}}
    head = orjson.dumps(header)
    return head + np.arange(4, dtype=np.float32).tobytes() + np.arange(3, dtype=np.int64).tobytes(), len(head)


def _same(a: InferRequest, b: InferRequest) -> None:
    assert a._replace(inputs={}) == b._replace(inputs={})
    assert list(a.inputs) == list(b.inputs)
    for x, y in zip(a.inputs.values(), b.inputs.values(), strict=True):
        assert (x.name, x.dtype, x.shape) == (y.name, y.dtype, y.shape)
        np.testing.assert_array_equal(x.data, y.data)
        assert x.data.dtype == y.data.dtype and x.data.shape == y.data.shape


def test_a_planned_request_is_the_regular_decode_s() -> None:
    body, hl = _body()
    assert v2.decode_planned(body, str(hl), "m", 1) is None  # never decoded: not planned
    expected = v2.decode_infer_request(body, hl, "m", 1)
    planned = v2.decode_planned(body, str(hl), "m", 1)
    if not fastpath.enabled:
        assert planned is None
        return
    assert planned is not None
    _same(planned, expected)
    assert planned.parameters is not expected.parameters  # each request its own
    assert v2.decode_planned(body + b"x", str(hl), "m", 1) is None  # more binary data than the plan's
    assert v2.decode_planned(body, f" {hl}", "m", 1) is None  # a text never planned: parsed the regular way
    other, other_hl = _body("s")
    assert other_hl == hl and v2.decode_planned(other, str(hl), "m", 1) is None  # another header


class _Counted(np.ndarray):
    """An output array that counts its copies to bytes."""

    copies = 0

    def tobytes(self, order: Any = "C") -> bytes:
        _Counted.copies += 1
        return super().tobytes(order)


def test_an_answer_with_no_plan_copies_nothing_before_the_general_encoder() -> None:
    """A response never planned (a JSON answer, BYTES, a first request) is looked up by names, types and shapes
    before any output is copied: a large output asked for as JSON is not copied on the hub for nothing."""
    big = np.zeros(1 << 16, np.float32).view(_Counted)
    request = _request((RequestedOutput("OUTPUT0", binary=False),), False, "no-plan")
    _Counted.copies = 0
    assert v2r.encode_planned(request, InferResponse([("OUTPUT0", big)]), 3) is None
    assert _Counted.copies == 0

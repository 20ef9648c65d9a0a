"""A decode plan for ``ModelInferRequest`` bytes (a fast path beside :func:`.v2_grpc.decode_infer_request`).

A client repeating a request (perf_analyzer, a tritonclient loop) sends the same message each time but
for the bytes of its ``raw_input_contents``. Protobuf writers put fields in number order, so those bytes
are the message's last fields (number 7): the bytes before them (model, version, id, parameters,
inputs, outputs) and each raw entry's tag and length come back unchanged. A message decoded once is kept
as a plan keyed by its length; a message of that length whose header bytes and raw entries' prefixes
match the plan's decodes to the plan's request with fresh zero-copy views of its own bytes, without the
protobuf parse and the per-field work. Nothing in a plan depends on a model (no known-input check: at
most ``MANY_INPUTS`` inputs), on shared memory (none named) or on a datatype needing a conversion
(BYTES, BF16): the slow path's checks all passed for the same header, and its errors are its own.

:func:`parse_infer` is the ``ModelInfer`` method's parse: the message (slow path, or a message the plan
does not cover), or a :class:`Planned` request already decoded.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import TritonError
from ..inference import InferInput, InferRequest
from ..runtime import fastpath
from ._generated import grpc_service_pb2 as pb
from .dtypes import BF16, BYTES
from .v2_grpc import decode_infer_request
from .v2_http import MANY_INPUTS


class Planned(NamedTuple):
    """A ``ModelInfer`` request decoded before its route: what the route needs, and the request."""

    model_name: str
    version: int
    request: InferRequest


class _Plan(NamedTuple):
    header: bytes  # the message's bytes before its raw_input_contents
    # per input, in order: name, its raw entry's tag and length bytes and their offset, numpy dtype, element
    # count, the offset of its contents, (name, dtype, shape), and the shape to reshape the view to (None:
    # one dimension, the view as it is)
    inputs: tuple[tuple[str, bytes, int, np.dtype, int, int, tuple[str, Any, tuple[int, ...]],
                        tuple[int, ...] | None], ...]
    head: tuple[str, int, str]  # model, version, id
    outputs: tuple[Any, ...] | None
    params: dict[str, Any]  # forwarded to the model: a copy per request
    tail: tuple[Any, ...]  # InferRequest's fields after ``parameters``


# keyed by message length: a plan is checked against the message's bytes before it is used, so a
# length two requests share costs a miss, never a wrong request
_PLANS = fastpath.cache("v2_grpc.plans", 256)
_RAW_TAG = 7 << 3 | 2  # raw_input_contents: field 7, length-delimited
_CONVERTED = frozenset(("BYTES", "BF16"))  # datatypes decoded by a conversion, not a view: never planned
_MOST_ENTRIES = 64  # outputs or request parameters: more are decoded by the offload rule (the slow path)


def parse_infer(data: bytes) -> pb.ModelInferRequest | Planned:
    """``ModelInfer``'s request: a :class:`Planned` one when a kept plan matches ``data`` or one can be
    made of it, else the parsed message (raises protobuf's ``DecodeError`` as ``FromString`` does)."""
    plan = _PLANS.get(len(data))
    if plan is not None and data.startswith(plan.header):
        planned = _from_plan(plan, data)
        if planned is not None:
            return planned
    msg = pb.ModelInferRequest.FromString(data)
    if not fastpath.enabled or data.__class__ is not bytes or not _plannable(msg):
        return msg
    try:
        request = decode_infer_request(msg)
    except TritonError:
        return msg  # the slow path answers it, in its order (the route's errors first)
    plan = _plan_of(data, request)
    if plan is not None:
        _PLANS.put(len(data), plan)
    return Planned(request.model_name, request.model_version, request)


def _from_plan(plan: _Plan, data: bytes) -> Planned | None:
    inputs = {}
    frombuffer, startswith, new = np.frombuffer, data.startswith, fastpath.new_tuple
    for name, prefix, at, np_dtype, count, offset, described, shape in plan.inputs:
        if not startswith(prefix, at):
            return None
        array = frombuffer(data, np_dtype, count, offset)
        inputs[name] = new(InferInput, (*described, array if shape is None else array.reshape(shape)))
    model, version, rid = plan.head
    params = plan.params
    return new(Planned, (model, version, new(InferRequest, (
        model, version, rid, inputs, plan.outputs, dict(params) if params else params, *plan.tail))))


def _plannable(msg: pb.ModelInferRequest) -> bool:
    """Whether ``msg`` may have a plan, decoded without the route, the shared memory or the offload rule:
    one raw entry per input (no parameters, no typed contents, no BYTES or BF16), few inputs, outputs and
    parameters, none naming shared memory. Read once per miss; anything else is left to the slow path
    whole (a message the servicer reads)."""
    tensors = msg.inputs[:]
    if not tensors or len(msg.raw_input_contents) != len(tensors) or len(tensors) > MANY_INPUTS \
            or len(msg.outputs) > _MOST_ENTRIES or len(msg.parameters) > _MOST_ENTRIES:
        return False
    if any(t.parameters or t.HasField("contents") or t.datatype in _CONVERTED for t in tensors):
        return False
    return not any("shared_memory_region" in o.parameters for o in msg.outputs)


def _plan_of(data: bytes, request: InferRequest) -> _Plan | None:
    """The plan of a message just decoded to ``request``, or None when its bytes are not header fields
    then one raw entry per input, or an input is of a datatype or size the plan does not cover."""
    split = _split_raw(data)
    if split is None:
        return None
    header, raws = split
    if len(raws) != len(request.inputs):
        return None
    planned = []
    for tensor, (prefix, at, size) in zip(request.inputs.values(), raws, strict=True):
        dtype, count = tensor.dtype, tensor.data.size
        if dtype is BYTES or dtype is BF16 or not count or size != count * dtype.itemsize:
            return None
        planned.append((tensor.name, prefix, at, dtype.numpy, count, at + len(prefix), (tensor.name, dtype, tensor.shape),
                        None if len(tensor.shape) == 1 else tensor.shape))
    return _Plan(data[:header], tuple(planned), (request.model_name, request.model_version, request.id),
                 request.outputs, request.parameters, tuple(request[6:]))


def _split_raw(data: bytes) -> tuple[int, list[tuple[bytes, int, int]]] | None:
    """(bytes before the first raw entry, [(entry's tag and length bytes, their offset, the entry's size)]) when every field
    from the first raw entry on is a raw entry; None otherwise (or for a field this walk cannot skip)."""
    pos, end, header, raws = 0, len(data), None, []
    while pos < end:
        start = pos
        tag, pos = _varint(data, pos)
        kind = tag & 7
        if kind == 2:
            size, pos = _varint(data, pos)
            if tag == _RAW_TAG:
                if header is None:
                    header = start
                raws.append((data[start:pos], start, size))
            pos += size
        elif kind == 0:
            pos = _varint(data, pos)[1]
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
        else:
            return None
        if header is not None and tag != _RAW_TAG:
            return None  # a field after the raw contents
    if header is None or pos != end:
        return None
    return header, raws


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7

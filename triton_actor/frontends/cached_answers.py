"""Answers to response-cache hits from bytes encoded once per cache entry (a fast path, ``runtime/fastpath.py``).

A hit found before the scheduler (``plane/cache_front.py``) carries its cache entry. The first hit of
an entry in a front end's variant (HTTP: the request's output selection and binary choices; gRPC: its
output selection) is encoded as any answer, with no request id, and kept beside the entry (counted in
the cache's bytes, :meth:`~..actors.model.cached.CachedVersion.remember`); every later hit sends those
bytes with its own request's id put in, where the regular encoder puts it: first in the HTTP JSON
header, as field 3 of a gRPC ``ModelInferResponse`` (after the model's name and version). Outputs
classified or written to shared memory are encoded on every hit (labels are the serving version's, a
region's contents the client's), as are hits on the slow path (the regular encoder on a fresh
response, ``entry.response()``).

A request named by its bytes goes one step earlier (``plane/cache_front.py``'s ``again``): an HTTP body
of binary tensors or of JSON data (:func:`http_again`), or a gRPC ``ModelInferRequest``'s bytes with its id cut out
(:func:`grpc_again`, ``protocol/grpc_infer_bytes.py``; the call's reader asks before it decodes the
message): bytes answered from the cache before are answered from the same entry again, with this
request's id, without being decoded, checked or keyed. A gRPC message naming a shared-memory region,
or one whose call forwards metadata to the model (``--grpc-header-forward-pattern``), is never
remembered so: the same bytes would name other inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..actors.model.cached import BODY_MAX
from ..actors.model.handles import CachedVersionHandle
from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..plane import cache_front
from ..plane.dataplane import DataPlane, Pending
from ..plane.route import Route
from ..protocol import grpc_infer_bytes, v2_grpc, v2_http
from ..protocol._generated import grpc_service_pb2 as pb
from ..protocol.v2_http import parse_header_length as parse_length
from ..runtime import fastpath

# (request, response, route) -> what the front end's regular encoder gives
Encode = Callable[[InferRequest, InferResponse, Route], Any]


def variant(request: InferRequest, front: str) -> tuple[Any, ...] | None:
    """What a front end's encoding of a cached answer depends on besides the entry and the id; None
    when it also depends on something outside the request (labels, shared memory)."""
    outputs = request.outputs
    if outputs is None:
        return front, request.binary_output, None
    for out in outputs:
        if out.classification or out.shm is not None:
            return None
    return front, request.binary_output, tuple((o.name, o.binary) for o in outputs)


def _answer(pending: Pending, request: InferRequest, front: str, encode: Encode,
            keep: Callable[[Any, InferRequest, Route], tuple[bytes, Any]],
            with_id: Callable[[tuple[bytes, Any], str], Any]) -> Any:
    """``with_id`` of what ``front`` kept of the hit's entry for ``request``'s variant (``keep`` makes it
    from the regular encoding, with no id, the first time); the regular encoding itself when such an
    answer is not kept."""
    hit = pending.hit
    kind = variant(request, front)
    if kind is None:
        return encode(request, hit.entry.response(), pending.route)
    kept = hit.entry.encoded.get(kind)
    if kept is None:
        kept = keep(encode(request._replace(id=""), hit.entry.response(), pending.route), request, pending.route)
        hit.front.remember(hit, kind, kept, len(kept[0]))
    return with_id(kept, request.id)


def _http_kept(encoded: tuple[list[bytes], int | None], request: InferRequest, route: Route) -> tuple[bytes, Any]:
    chunks, json_length = encoded
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), json_length


def _http_with_id(kept: tuple[bytes, Any], rid: str) -> tuple[list[bytes], int | None]:
    body, json_length = kept
    if not rid:
        return [body], json_length
    head = b'{"id":' + orjson.dumps(rid) + b","  # the regular encoder's header starts with the id
    return [head, memoryview(body)[1:]], (None if json_length is None else json_length + len(head) - 1)


def http_body(pending: Pending, request: InferRequest, encode: Encode,
              body: tuple[str | None, bytes] | None = None) -> tuple[list[bytes], int | None]:
    """The body chunks and JSON header length of a hit's HTTP answer (as ``encode`` gives them).
    ``body``: the request's header length and body when those bytes alone decide ``request`` (no
    headers forwarded, no content coding), remembered for :func:`http_again` when they always decode
    to it (:func:`_decodes_alone`)."""
    answer = _answer(pending, request, "http", encode, _http_kept, _http_with_id)
    if body is not None and _decodes_alone(body[1], parse_length(body[0])):
        cache_front.learn(pending.hit, body, len(body[1]), variant(request, "http"), request.id)
    return answer


def _decodes_alone(body: bytes, header_length: int | None) -> bool:
    """Whether the same ``body`` always decodes to the same request: binary tensors a kept plan read,
    or a JSON body (its tensors' data in its text) that names no shared-memory region (whose
    contents change under the same bytes). The JSON case is what a plain V2 JSON client repeats:
    its decode (orjson, a tensor per input, the checks) is most of a hit's cost otherwise."""
    if header_length is None:
        return bool(body) and b"shared_memory_region" not in body
    return v2_http.planned(body, header_length)


def http_again(plane: DataPlane, route: Route, body: tuple[str | None, bytes]) -> tuple[list[bytes], int | None] | None:
    """The answer to a request body answered from the cache before (``plane/cache_front.py``'s
    :func:`~..plane.cache_front.again`), or None."""
    known = cache_front.again(plane, route, body, len(body[1]))
    return None if known is None else _http_with_id(*known)


class Serialized:
    """A gRPC answer already serialized (what the call sends of a message: ``SerializeToString()``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # protobuf's name: what the call sends of a message
        return self.data


def _grpc_kept(message: Any, request: InferRequest, route: Route) -> tuple[bytes, Any]:
    """The message's bytes and where its id goes: after the model's name and version (fields 1, 2)."""
    at = pb.ModelInferResponse(model_name=request.model_name, model_version=str(route.version)).ByteSize()
    return message.SerializeToString(), at


def _grpc_with_id(kept: tuple[bytes, Any], rid: str) -> Serialized:
    data, at = kept
    if not rid:
        return Serialized(data)
    return Serialized(b"".join((data[:at], pb.ModelInferResponse(id=rid).SerializeToString(), data[at:])))


def grpc_message(pending: Pending, request: InferRequest, encode: Encode) -> Any:
    """A hit's ``ModelInferResponse``, or its bytes (:class:`Serialized`)."""
    return _answer(pending, request, "grpc", encode, _grpc_kept, _grpc_with_id)


def grpc_again(plane: DataPlane, buf: bytes | bytearray) -> tuple[bytes | None, Any]:
    """``buf``, one uncompressed gRPC message (a ModelInferRequest): ``(its answer's bytes, None)``, the
    message taken out of ``buf`` (a call's buffer), when the same bytes but for the id were answered from
    the cache before (``protocol/grpc_infer_bytes.py``); else ``(None, what grpc_learn remembers it by, or None)``.

    The bytes are looked up by their head alone (``split_head``: the name, version and id, where every
    serializer writes them) and walked whole (``split_id``, 4-5 times the bytecodes for add_sub's
    request) only when that finds nothing, for what :func:`grpc_learn` remembers them by."""
    if len(buf) < 5 or buf[0] or int.from_bytes(buf[1:5], "big") != len(buf) - 5 or len(buf) > BODY_MAX:
        return None, None
    data = bytes(buf[5:])
    head = grpc_infer_bytes.split_head(data) if fastpath.enabled else None
    if head is not None:
        route = _route(plane, head)
        known = None if route is None else cache_front.again(plane, route, head[0], len(head[0]))
        if known is not None:
            if buf.__class__ is bytearray:
                del buf[:]
            return _grpc_with_id(known[0], head[3].decode()).data, None
        if route is not None and route.target.__class__ is not CachedVersionHandle:
            return None, None  # nothing to remember: a version without the cache
    split = grpc_infer_bytes.split_id(data)
    if split is None:
        return None, None
    rest = split[0]
    if head is not None and rest == head[0]:  # looked up above
        return None, (None if b"shared_memory_region" in rest else rest)
    route = _route(plane, split)
    known = None if route is None else cache_front.again(plane, route, rest, len(rest))
    if known is None:
        return None, (None if b"shared_memory_region" in rest else rest)  # the same bytes, another region's contents
    if buf.__class__ is bytearray:
        del buf[:]
    return _grpc_with_id(known[0], split[3].decode()).data, None


def _route(plane: DataPlane, split: tuple[bytes, bytes, bytes, bytes]) -> Route | None:
    """The route of a message's name and version (their raw bytes), and its id checked as UTF-8; None
    when either is wrong: the regular decode says what is wrong."""
    _rest, name, version, rid = split
    try:
        rid.decode()
        return plane.route(name.decode(), v2_grpc.parse_version(version.decode()) if version else -1)
    except (TritonError, UnicodeDecodeError):
        return None


def grpc_learn(rest: bytes, request: InferRequest, pending: Pending) -> None:
    """Remember that a ModelInferRequest's bytes without its id (``rest``) were answered from the cache."""
    if pending.hit is not None:
        cache_front.learn(pending.hit, rest, len(rest), variant(request, "grpc"), "")

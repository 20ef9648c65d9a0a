"""Answers to response-cache hits from kept bytes (frontends/cached_answers.py): byte for byte what the
regular encoders give the same request, whatever its id, and each hit with its own request's id."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from triton_actor.actors.model.cached import Hit
from triton_actor.cache import entry as cache_entry
from triton_actor.cache.local import LocalCache
from triton_actor.frontends import cached_answers
from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.plane.dataplane import Pending
from triton_actor.protocol import v2_grpc, v2_http_response
from triton_actor.protocol._generated import grpc_service_pb2 as pb
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime import fastpath
from triton_actor.runtime.fastpath import BoundedCache


class _Route:
    version, labels, batching = 3, {}, False


class _Front:
    """The cache front's part the answers use: keeps what is encoded, in a real local store."""

    def __init__(self, store: LocalCache) -> None:
        self.store = store
        self.kept = 0
        self.bodies: BoundedCache[Any, Any] = BoundedCache("test.bodies", 8)

    def remember(self, hit: Hit, variant: Any, encoded: Any, nbytes: int) -> None:
        if self.store.grow(hit.key, hit.entry, nbytes):
            hit.entry.encoded[variant] = encoded
            self.kept += 1


def _hit() -> tuple[Pending, _Front]:
    produced = InferResponse([("SUM", np.arange(4, dtype=np.float32)), ("DIFF", np.ones(4, np.int32))])
    entry = cache_entry.from_response(produced)
    assert entry is not None
    store = LocalCache(1 << 20)
    store.insert(b"key", entry)
    front = _Front(store)
    return Pending(None, _Route(), Hit(entry, b"key", front)), front  # type: ignore[arg-type]


def _request(rid: str, outputs: tuple[RequestedOutput, ...] | None = None, binary: bool = False) -> InferRequest:
    data = np.zeros(4, np.float32)
    return InferRequest("add_sub", 3, rid, {"IN": InferInput("IN", BY_WIRE["FP32"], (4,), data)}, outputs,
                        binary_output=binary)


def _http(request: InferRequest, response: InferResponse, route: Any) -> tuple[list[bytes], int | None]:
    return v2_http_response.encode_infer_response(request, response, route.version, route.labels, route.batching)


def _grpc(request: InferRequest, response: InferResponse, route: Any) -> pb.ModelInferResponse:
    return v2_grpc.encode_infer_response(request, response, route.version, route.labels, route.batching)


IDS = ["", "a", "1", 'q"uote\\', "é\u2028\U0001f600", "x" * 300]
SELECTIONS = [(None, False), (None, True), ((RequestedOutput("DIFF", binary=True),), False),
              ((RequestedOutput("SUM", binary=False), RequestedOutput("DIFF")), True)]


@pytest.mark.parametrize(("outputs", "binary"), SELECTIONS)
def test_http_answers_are_the_regular_encoders_bytes_with_each_requests_id(outputs: Any, binary: bool) -> None:
    pending, front = _hit()
    for rid in [*IDS, *reversed(IDS)]:  # kept after the first; a stale id would show on the way back
        request = _request(rid, outputs, binary)
        chunks, length = cached_answers.http_body(pending, request, _http)
        want_chunks, want_length = _http(request, pending.hit.entry.response(), _Route())
        assert (b"".join(chunks), length) == (b"".join(want_chunks), want_length)
        head = orjson.loads(b"".join(chunks)[:length] if length is not None else b"".join(chunks))
        assert head.get("id", "") == rid
    assert front.kept == 1 and pending.hit.entry.extra > 0


@pytest.mark.parametrize(("outputs", "binary"), SELECTIONS)
def test_grpc_answers_are_the_regular_encoders_bytes_with_each_requests_id(outputs: Any, binary: bool) -> None:
    pending, front = _hit()
    for rid in [*IDS, *reversed(IDS)]:
        request = _request(rid, outputs, binary)
        data = cached_answers.grpc_message(pending, request, _grpc).SerializeToString()
        assert data == _grpc(request, pending.hit.entry.response(), _Route()).SerializeToString()
        assert pb.ModelInferResponse.FromString(data).id == rid
    assert front.kept == 1


def test_each_output_selection_is_kept_apart_and_classification_is_never_kept() -> None:
    pending, front = _hit()
    for outputs, binary in SELECTIONS:
        cached_answers.http_body(pending, _request("", outputs, binary), _http)
    cached_answers.grpc_message(pending, _request(""), _grpc)
    assert front.kept == len(SELECTIONS) + 1
    classified = _request("c", (RequestedOutput("SUM", classification=2),))
    chunks, _ = cached_answers.http_body(pending, classified, _http)
    assert orjson.loads(b"".join(chunks))["outputs"][0]["data"] == ["3.000000:3", "2.000000:2"]
    assert front.kept == len(SELECTIONS) + 1


def _json_body(**extra: Any) -> bytes:
    return orjson.dumps({"id": "j", "inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0],
                                                **extra}]})


def test_a_json_body_is_remembered_unless_it_names_shared_memory() -> None:
    """A plain V2 JSON request decodes from its bytes alone: its hits are answered by them next time
    (http_again); one naming a shared-memory region is not (the region's contents change). Nothing is
    remembered with fast paths off (TRITON_ACTOR_FAST_PATHS=0)."""
    pending, front = _hit()
    body = (None, _json_body())
    chunks, _ = cached_answers.http_body(pending, _request("j"), _http, body)
    assert orjson.loads(b"".join(chunks))["id"] == "j"
    assert front.bodies.get(body) == ((b"key", ("http", False, None), "j") if fastpath.enabled else None)
    shm_body = (None, _json_body(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 16}))
    cached_answers.http_body(pending, _request("j"), _http, shm_body)
    unplanned_binary = ("5", b"{}{}{}")  # a header no kept plan read: its tensors may be JSON data or a region's
    cached_answers.http_body(pending, _request("j"), _http, unplanned_binary)
    assert front.bodies.get(shm_body) is None and front.bodies.get(unplanned_binary) is None and len(front.bodies) == int(fastpath.enabled)

"""One route per request (``plane/route.py``): the data plane looks a request's version up once, keeps
why none serves it for the moment the request is queued, and routes again when a reload swapped the
model's handle while the request was being decoded."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from triton_actor.actors.model.handles import READY, UNAVAILABLE, ModelHandle, VersionHandle
from triton_actor.actors.model.validation import RequestValidator
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest
from triton_actor.plane.dataplane import DataPlane
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository import config as config_mod

FP32 = BY_WIRE["FP32"]
CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


class _Scheduler:
    """Records what is queued with it (the scheduler actor's ``ref.tell``)."""

    def __init__(self) -> None:
        self.queued: list[Any] = []
        self.ref = SimpleNamespace(tell=self.queued.append)

    def direct(self, _item: Any) -> bool:
        return False  # never runs a request itself: everything is queued


def _model(*versions: int, unready: tuple[int, ...] = ()) -> ModelHandle:
    cfg = config_mod.parse_text(CONFIG, "m", "config.pbtxt")
    handles = {v: VersionHandle(v, UNAVAILABLE if v in unready else READY, "", _Scheduler(), RequestValidator(cfg),
                                {"v": [str(v)]}) for v in versions}
    return ModelHandle("m", cfg, handles, tuple(v for v in versions if v not in unready))


def _plane(model: ModelHandle | None) -> DataPlane:
    repository = SimpleNamespace(routes=MappingProxyType({"m": model} if model else {}))
    plane = DataPlane(repository)  # type: ignore[arg-type]
    plane.accepting = True
    return plane


def _request(version: int = -1, name: str = "m") -> InferRequest:
    return InferRequest(name, version, "", {"X": InferInput("X", FP32, (1, 1), np.ones((1, 1), np.float32))})


def test_a_request_is_queued_with_the_version_its_route_resolved() -> None:
    model = _model(1, 2)
    plane = _plane(model)
    route = plane.route("m", -1)
    assert route.version == 2 and route.labels == {"v": ["2"]} and route.batching
    assert set(route.inputs) == {"X"}  # type: ignore[arg-type]
    pending = plane.infer_start(_request(), route=route)
    assert pending.route is route
    assert len(model.versions[2].scheduler.queued) == 1 and not model.versions[1].scheduler.queued


def test_a_reload_while_the_request_was_decoded_routes_it_again() -> None:
    plane = _plane(_model(1))
    route = plane.route("m", -1)
    reloaded = _model(1, 2)
    plane.repository.routes = MappingProxyType({"m": reloaded})  # the repository actor swapped the handle
    pending = plane.infer_start(_request(), route=route)
    assert pending.route is not route and pending.route.version == 2
    assert len(reloaded.versions[2].scheduler.queued) == 1


def test_why_no_version_serves_is_raised_when_the_request_is_queued() -> None:
    plane = _plane(None)
    route = plane.route("m", 3)  # no error yet: the body is decoded first, as before routes
    assert route.inputs is None and route.target is None
    with pytest.raises(TritonError) as info:
        plane.infer_start(_request(3), route=route)
    assert info.value.code == Code.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'm' is not found"
    with pytest.raises(TritonError, match="is not found"):
        route.raw_input_spec()

    plane = _plane(_model(1, 2, unready=(2,)))
    with pytest.raises(TritonError) as info:
        plane.infer_start(_request(2), route=plane.route("m", 2))
    assert info.value.message == "Request for unknown model: 'm' version 2 is not at ready state"


def test_a_draining_server_refuses_clients_and_serves_models() -> None:
    model = _model(1)
    plane = _plane(model)
    plane.accepting = False
    with pytest.raises(TritonError) as info:
        plane.infer_start(_request(), route=plane.route("m", -1))
    assert info.value.code == Code.UNAVAILABLE and info.value.message == "Server not ready"
    plane.infer_start(_request(), internal=True, route=plane.route("m", -1, internal=True))  # a BLS call
    assert len(model.versions[1].scheduler.queued) == 1


def test_a_route_for_another_model_or_version_is_not_used() -> None:
    model = _model(1, 2)
    plane = _plane(model)
    pending = plane.infer_start(_request(1), route=plane.route("m", -1))
    assert pending.route.version == 1 and len(model.versions[1].scheduler.queued) == 1


def test_decoupled_models_are_refused_by_the_route() -> None:
    model = _model(1)
    model.config.model_transaction_policy.decoupled = True
    route = _plane(model).route("m", -1)
    with pytest.raises(TritonError) as info:
        route.refuse_decoupled("no streams here")
    assert info.value.code == Code.UNSUPPORTED


def test_a_route_is_reused_while_the_routing_table_stays_and_made_anew_after_a_change() -> None:
    from triton_actor.runtime import fastpath

    plane = _plane(_model(1))
    first = plane.route("m", -1)
    again = plane.route("m", -1)
    assert (again is first) == fastpath.enabled  # fast path: no new Route per request; slow path: a new one each time
    assert again == first
    assert plane.route("m", 1) is not first  # another version asked for: a route of its own
    plane.accepting = False
    assert plane.route("m", -1).closed and not first.closed  # the server's state is part of the route
    plane.accepting = True
    reloaded = _model(1, 2)
    plane.repository.routes = MappingProxyType({"m": reloaded})  # a new table: routes of the old one are not served
    after = plane.route("m", -1)
    assert after.model is reloaded and after.version == 2
    plane.repository.routes = MappingProxyType({})  # unloaded: the old route is not kept alive by the plane
    assert plane.route("m", -1).target is None
    assert len(plane._routes) == 0 or not fastpath.enabled



def test_a_routes_error_starts_a_fresh_traceback_each_time_it_is_raised() -> None:
    """A route is read several times per request (decode, enqueue, encode) and raises its one error each
    time no version serves: each raise must start its own traceback, not extend the last one's."""
    route = _plane(None).route("m", -1)
    depths = set()
    for _ in range(20):
        with pytest.raises(TritonError) as info:
            route.serving()
        tb, n = info.value.__traceback__, 0
        while tb is not None:
            n, tb = n + 1, tb.tb_next
        depths.add(n)
    assert route.error is not None and len(depths) == 1, depths

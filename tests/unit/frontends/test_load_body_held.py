"""Issue 23: a load request's config override (up to 4 MiB) is not held by the front end while the model
loads. Both front ends, served for real on port 0 in this process (a data plane double behind them),
with the official clients; while the plane's ``load_model`` runs, every frame of the request's greenlet
is searched for what it holds: no request body, message or text of the override's size, directly or
one container or object away. Before: HTTP's driver held the body (``_serve``'s ``body``, the router's
argument, ``HttpRequest.body``) and gRPC's servicer the parsed ``RepositoryModelLoadRequest``, for the
whole load."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any
from unittest.mock import MagicMock

import gevent
import pytest
from google.protobuf.message import Message

from triton_actor.config.settings import Settings
from triton_actor.frontends.grpc import GrpcServicer
from triton_actor.frontends.grpc_h2 import GrpcH2Server
from triton_actor.frontends.http import HttpFrontend
from triton_actor.frontends.http_routes import create_app
from triton_actor.frontends.http_server import HttpServer

SIZE = 1 << 20  # the override's filler: past the 64 KiB from which a body is handed over, not copied
CONFIG = json.dumps({"backend": "python", "parameters": {"filler": {"string_value": "x" * SIZE}}})


def _near(value: Any) -> Iterator[Any]:
    """``value`` and what it holds directly: a container's items, an object's attributes or slots."""
    yield value
    if isinstance(value, (bytes, bytearray, str, Message)):
        return
    if isinstance(value, (tuple, list)):
        yield from value
    elif isinstance(value, dict):
        yield from value.values()
    else:
        yield from getattr(value, "__dict__", {}).values()
        for cls in type(value).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and hasattr(value, slot):
                    yield getattr(value, slot)


def _held(frame: FrameType | None) -> list[str]:
    """Where the frames from ``frame`` up hold the override's size in bytes, text or a message."""
    found = []
    while frame is not None:
        for name, value in frame.f_locals.items():
            for v in _near(value):
                if isinstance(v, Message) or (isinstance(v, (bytes, bytearray, str)) and len(v) >= SIZE):
                    found.append(f"{frame.f_code.co_name}: {name} ({type(v).__name__})")
        frame = frame.f_back
    return found


def _plane() -> tuple[MagicMock, list[list[str]]]:
    """A data plane double whose ``load_model`` takes the config text as the real one does (popped)
    and records what the request's frames still hold at that moment."""
    plane = MagicMock()
    seen: list[list[str]] = []

    def load_model(name: str, parameters: dict[str, Any], demand: bool = False) -> None:
        assert len(parameters.pop("config")) == len(CONFIG)
        seen.append(_held(sys._getframe(1)))

    plane.load_model.side_effect = load_model
    return plane, seen


@pytest.mark.usefixtures("fast_paths")  # the router's route cache (takes_body asks it) on and off
def test_an_http_load_body_is_not_held_while_the_model_loads() -> None:
    plane, seen = _plane()
    server = HttpServer("127.0.0.1", 0, HttpFrontend(create_app(plane)))
    server.start()
    body = json.dumps({"parameters": {"config": CONFIG}}).encode()

    def load() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("POST", "/v2/repository/models/m/load", body, {"Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        return status

    try:
        assert gevent.spawn(load).get(timeout=30) == 200
    finally:
        server.stop()
    assert seen == [[]]


@pytest.mark.usefixtures("fast_paths")
def test_a_grpc_load_message_is_not_held_while_the_model_loads() -> None:
    import tritonclient.grpc as grpcclient

    plane, seen = _plane()
    server = GrpcH2Server.from_settings(GrpcServicer(plane), Settings(grpc_address="127.0.0.1", grpc_port=0))
    port = server.start()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        client.load_model("m", config=CONFIG)
    finally:
        client.close()
        server.stop(1.0)
    assert seen == [[]]

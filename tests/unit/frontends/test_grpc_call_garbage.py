"""A finished gRPC call leaves nothing for the garbage collector. A stream pointed at its call and the
call at its stream: a reference cycle per call that only a collection freed (under perf_analyzer at
concurrency 1, 258 young, 23 middle and 2 full collections in 3 s, where there are none now). Served for
real on port 0 in this process, called with the official client; what the collector finds is counted by
type."""

from __future__ import annotations

import gc
from unittest.mock import MagicMock

import pytest

from triton_actor.config.settings import Settings
from triton_actor.frontends.grpc import GrpcServicer
from triton_actor.frontends.grpc_calls import Call
from triton_actor.frontends.grpc_h2 import GrpcH2Server
from triton_actor.protocol.h2_events import H2Stream

CALLS = 40


@pytest.mark.usefixtures("fast_paths")
def test_finished_calls_are_freed_without_the_collector() -> None:
    import tritonclient.grpc as grpcclient

    server = GrpcH2Server.from_settings(GrpcServicer(MagicMock()), Settings(grpc_address="127.0.0.1", grpc_port=0))
    port = server.start()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free is kept in gc.garbage instead
    try:
        for _ in range(CALLS):
            client.load_model("m")  # a unary call answered by the plane's double
        gc.collect()
        # this server's calls and their streams only: another test's server may let go of its own meanwhile
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, Call) and o.conn.server is server]
        left += [type(o).__name__ for o in gc.garbage if isinstance(o, H2Stream) and isinstance(o.call, Call)
                 and o.call.conn.server is server]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        client.close()
        server.stop(1.0)
    assert left == [], f"{len(left)} calls and streams freed only by the collector after {CALLS} calls"

"""Requests that fail, BLS calls that fail, calls refused and connections closed leave nothing of ours for the garbage collector.

An error turned into an answer kept its traceback, whose frames held what held the error (the request's
pending reply, the cached route that carries an unknown model's error): a cycle per failed request, with
the request, its tensors and its connection's objects in it. A gRPC call refused before it ran kept its
stream, and every gRPC connection was a cycle of its own (its frame handlers, bound methods, on itself;
its timer greenlet's exit). The server runs in this process (port 0) and is called with the official
clients; what a collection finds while ``gc.DEBUG_SAVEALL`` keeps it is counted: objects of our types and
the frames of our code."""

from __future__ import annotations

import gc
import types
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.config.command_line import parse
from triton_actor.server import Server

from .server import IDENTITY_CONFIG, IDENTITY_PY, add_model

CALLER_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            called = pb_utils.InferenceRequest(model_name="nope", requested_output_names=["OUTPUT0"],
                                               inputs=[x]).exec()
            assert called.has_error(), "the call to a model that does not exist answered"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.as_numpy())]))
        return out
"""
ROUNDS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("garbage")
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(repo, "caller", IDENTITY_CONFIG, CALLER_PY)  # its BLS call fails: the model gets the error
    settings = parse(["--model-repository", str(repo), "--http-port", "0", "--http-address", "127.0.0.1",
                      "--grpc-port", "0", "--grpc-address", "127.0.0.1", "--allow-metrics=false"])
    server = Server(settings)
    server.start_actors()
    server.serve()
    server.load_models()
    server.plane.accepting = True
    try:
        yield server
    finally:
        server.stop()


def _ours(found: list[object]) -> list[str]:
    """What of ours a collection found: objects of our types, frames of our code."""
    names = []
    for o in found:
        if isinstance(o, types.FrameType):  # (not getattr: a closed socket raises on any attribute)
            if "/triton_actor/" in o.f_code.co_filename:
                names.append(f"frame {o.f_code.co_name}")
        elif type(o).__module__.startswith("triton_actor"):
            names.append(type(o).__name__)
    return names


def _left_by(calls: Callable[[], None]) -> list[str]:
    """Our objects that only the collector frees after ``calls`` ran ROUNDS times."""
    calls()  # first-time imports and caches
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free is kept in gc.garbage instead
    try:
        for _ in range(ROUNDS):
            calls()
        gc.collect()
        return sorted(set(_ours(gc.garbage)))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _input(client: object, dtype: str = "FP32") -> object:
    x = client.InferInput("INPUT0", [2], dtype)  # type: ignore[attr-defined]
    x.set_data_from_numpy(np.ones(2, np.float32 if dtype == "FP32" else np.int32))
    return x


def test_failed_http_requests_and_bls_calls_leave_no_cycles(server: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")

    def calls() -> None:
        for model, dtype in (("nope", "FP32"), ("identity", "INT32")):  # not found; refused by the validator
            with pytest.raises(InferenceServerException):
                client.infer(model, [_input(httpclient, dtype)])
        for model in ("identity", "caller"):
            assert client.infer(model, [_input(httpclient)]).as_numpy("OUTPUT0").tolist() == [1.0, 1.0]

    try:
        assert _left_by(calls) == []
    finally:
        client.close()


def test_failed_grpc_calls_refused_calls_and_closed_connections_leave_no_cycles(server: Server) -> None:
    target = f"127.0.0.1:{server.grpc.server_port}"

    def calls() -> None:
        client = grpcclient.InferenceServerClient(target)  # a connection of its own, closed after
        try:
            for model, dtype in (("nope", "FP32"), ("identity", "INT32")):
                with pytest.raises(InferenceServerException):
                    client.infer(model, [_input(grpcclient, dtype)])
            assert client.infer("identity", [_input(grpcclient)]).as_numpy("OUTPUT0").tolist() == [1.0, 1.0]
        finally:
            client.close()
        with grpc.insecure_channel(target) as channel:  # a method the server does not have: refused at once
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary("/inference.GRPCInferenceService/Nope")(b"")
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED

    assert _left_by(calls) == []


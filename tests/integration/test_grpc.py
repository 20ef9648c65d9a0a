"""gRPC-only behaviour, checked against what Triton 2.51 answers: typed contents, bad requests,
streams, the health service, settings, large messages, shutdown.

Raw RPCs use tritonclient's own generated modules (the ground truth for the wire format).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import gevent.queue
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from triton_actor.protocol._generated import health_pb2, health_pb2_grpc

from .clients import Client
from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model, wait_for_fifo
from .test_lifecycle import DECOUPLED_CONFIG, SLOW_CONFIG, SLOW_PY


@pytest.fixture
def stub(example_server: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """Raw RPCs (tritonclient's generated stubs) against our HTTP/2 transport."""
    channel = grpc.insecure_channel(example_server.grpc_url)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _request(model: str = "add_sub", sizes: tuple[int, int] = (16, 16), typed: bool = False) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    for name, size in zip(("INPUT0", "INPUT1"), sizes, strict=True):
        tensor = req.inputs.add(name=name, datatype="FP32", shape=[4])
        values = np.arange(size // 4, dtype=np.float32)
        if typed:
            tensor.contents.fp32_contents.extend(values.tolist())
        else:
            req.raw_input_contents.append(values.tobytes())
    return req


def _outputs(resp: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    return {o.name: np.frombuffer(raw, dtype=np.float32) for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)}


def _error(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(*args)  # type: ignore[operator]
    return e.value


def test_typed_contents_and_raw_give_the_same_answer(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    raw, typed = stub.ModelInfer(_request()), stub.ModelInfer(_request(typed=True))
    assert len(typed.raw_output_contents) == 2 and not typed.outputs[0].HasField("contents")  # always raw out
    for resp in (raw, typed):
        np.testing.assert_array_equal(_outputs(resp)["OUTPUT0"], [0, 2, 4, 6])
        np.testing.assert_array_equal(_outputs(resp)["OUTPUT1"], [0, 0, 0, 0])
        assert (resp.model_name, resp.model_version) == ("add_sub", "1")


BAD = [
    ("raw size", _request(sizes=(16, 12)), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 16, got 12"),
    ("typed size", _request(sizes=(16, 12), typed=True), grpc.StatusCode.INVALID_ARGUMENT,
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 16, got 12"),
    ("unknown model", _request("nope"), grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found"),
]


@pytest.mark.parametrize(("case", "request_", "code", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_requests_then_keeps_serving(stub: pb_grpc.GRPCInferenceServiceStub, case: str,
                                         request_: pb.ModelInferRequest, code: grpc.StatusCode, message: str) -> None:
    error = _error(stub.ModelInfer, request_)
    assert (error.code(), error.details()) == (code, message)
    assert len(stub.ModelInfer(_request()).raw_output_contents) == 2


def test_repeated_requests_read_their_own_data_and_a_lookalike_is_checked(
        stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """A request sent again with other data (decoded from a plan when fast paths are on,
    protocol/v2_grpc_plan.py) is answered from its own data; a request of the same length naming
    another input gets the validator's answer, and a wrong size Triton's."""
    for k in range(4):
        req = _request()
        req.raw_input_contents[1] = np.full(4, k, dtype=np.float32).tobytes()
        np.testing.assert_array_equal(_outputs(stub.ModelInfer(req))["OUTPUT0"], np.arange(4) + k)
    lookalike = _request()
    lookalike.inputs[1].name = "INPUT9"
    assert lookalike.ByteSize() == _request().ByteSize()
    error = _error(stub.ModelInfer, lookalike)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "[request id: <id_unknown>] unexpected inference input 'INPUT9' for model 'add_sub'")
    error = _error(stub.ModelInfer, _request(sizes=(16, 12)))
    assert error.details().endswith("input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 16, got 12")


def test_raw_and_typed_contents_together(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    req = _request()
    req.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    error = _error(stub.ModelInfer, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "contents field must not be specified when using raw_input_contents for 'INPUT0' " \
                              "for model 'add_sub'"
    del req.raw_input_contents[1]
    req.inputs[0].ClearField("contents")
    error = _error(stub.ModelInfer, req)
    assert error.details() == "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."


def test_malformed_protobuf(example_server: ServerProcess, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        error = _error(call, b"\xff\xff\xff\xff")
    assert (error.code(), error.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")  # as Triton
    assert stub.ServerLive(pb.ServerLiveRequest()).live


def test_model_ready_and_version_strings(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ModelReady(pb.ModelReadyRequest(name="add_sub")).ready
    # Triton answers OK with ready=false for unknown models and versions
    assert not stub.ModelReady(pb.ModelReadyRequest(name="add_sub", version="7")).ready
    assert not stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready
    error = _error(stub.ModelMetadata, pb.ModelMetadataRequest(name="add_sub", version="abc"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "version string 'abc'" in error.details()


def test_request_parameters(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    req = _request()
    req.parameters["triton_x"].bool_param = True
    error = _error(stub.ModelInfer, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "triton_enable_empty_final_response" in error.details()
    req = _request()
    req.parameters["triton_enable_empty_final_response"].bool_param = True  # the one allowed triton_ key
    req.parameters["custom"].string_param = "x"
    assert len(stub.ModelInfer(req).raw_output_contents) == 2


def test_health_service(example_server: ServerProcess) -> None:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_cuda_shared_memory_answers(grpc_client: Client) -> None:
    c = grpc_client.raw
    assert not c.get_cuda_shared_memory_status().regions
    c.unregister_system_shared_memory("zz")  # unknown region: a no-op, as Triton
    with pytest.raises(InferenceServerException) as e:
        c.register_cuda_shared_memory("c", base64.b64encode(bytes(64)), 0, 16)  # a handle, as get_raw_handle gives it
    assert e.value.status() == "StatusCode.UNIMPLEMENTED" and "CUDA" in e.value.message()


def test_large_tensor_beyond_grpc_default_limit(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "ident", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path)
    data = np.arange(3 * 1024 * 1024, dtype=np.float32)  # 12 MB each way; grpcio's default limit is 4 MB
    client = grpcclient.InferenceServerClient(server.grpc_url)
    i = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    i.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("ident", [i]).as_numpy("OUTPUT0"), data)
    client.close()


def test_decoupled_model_on_model_infer_is_unimplemented(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "dec", DECOUPLED_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path)
    with grpc.insecure_channel(server.grpc_url) as channel:
        req = pb.ModelInferRequest(model_name="dec")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        req.raw_input_contents.append(b"\0" * 4)
        error = _error(pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer, req)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.UNIMPLEMENTED, "ModelInfer RPC doesn't support models with decoupled transaction policy")


# -- ModelStreamInfer -----------------------------------------------------------------------------
def _on_stream(out: gevent.queue.Queue, result: object, error: object) -> None:
    out.put((result, error))


def test_stream_answers_each_request_and_survives_errors(grpc_client: Client) -> None:
    out: gevent.queue.Queue = gevent.queue.Queue()
    c = grpc_client.raw
    c.start_stream(callback=partial(_on_stream, out))
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    good = [grpc_client.input("INPUT0", a, "FP32"), grpc_client.input("INPUT1", b, "FP32")]
    c.async_stream_infer("add_sub", good, request_id="1")
    c.async_stream_infer("nope", good, request_id="2")
    c.async_stream_infer("add_sub", good, request_id="3")
    answers = [out.get(timeout=30) for _ in range(3)]
    c.stop_stream()
    by_id = {}
    errors = []
    for result, error in answers:
        if error is not None:
            errors.append(error)
            continue
        response = result.get_response()
        by_id[response.id] = result
        assert response.parameters["triton_final_response"].bool_param is True  # on every stream response (decoupled_models.md)
    assert sorted(by_id) == ["1", "3"]
    np.testing.assert_array_equal(by_id["3"].as_numpy("OUTPUT0"), a + b)
    assert len(errors) == 1 and "Request for unknown model: 'nope' is not found" in str(errors[0])


def test_stream_with_raw_stub_and_client_cancel(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    responses = stub.ModelStreamInfer(iter([_request(), _request(sizes=(16, 12)), _request()]))
    got = list(responses)
    assert [bool(r.error_message) for r in got].count(True) == 1
    assert sum(len(r.infer_response.raw_output_contents) == 2 for r in got) == 2
    # a client that goes away mid-stream: the server keeps serving
    call = stub.ModelStreamInfer(iter([_request()] * 50))
    next(call)
    call.cancel()
    assert len(stub.ModelInfer(_request()).raw_output_contents) == 2


def test_sigterm_drains_grpc(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "slow", SLOW_CONFIG, SLOW_PY)
    fifo = model_dir / "started.fifo"
    os.mkfifo(fifo)
    server = start_server(tmp_path)
    out: gevent.queue.Queue = gevent.queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    i = grpcclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    client.async_infer("slow", [i], partial(_on_stream, out))
    wait_for_fifo(fifo, server)
    server.proc.send_signal(signal.SIGTERM)
    _, error = out.get(timeout=60)
    assert error is None, error
    assert server.wait_exit(60) == 0
    client.close()



def test_grpc_port_in_use_exits_with_an_error(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "ident", IDENTITY_CONFIG, IDENTITY_PY)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server(tmp_path, flags=("--grpc-port", str(port)), wait=False)
        assert server.wait_exit(60) == 1
    assert f"failed to start: failed to bind gRPC to 127.0.0.1:{port}" in server.log()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("n", [300_000, 1_000_003])
def test_typed_contents_of_many_elements_are_decoded_off_the_hub(stub: pb_grpc.GRPCInferenceServiceStub, n: int) -> None:
    """More than 2^18 typed elements are converted on a native thread in slices (frontends/grpc.py):
    the answer is the same as the raw one, and a bad one is refused with the same message."""
    values = np.random.default_rng(1).random(n, dtype=np.float32)
    req = pb.ModelInferRequest(model_name="identity_batch")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, n]).contents.fp32_contents.extend(values)
    resp = stub.ModelInfer(req, timeout=120)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], dtype=np.float32), values)
    del req.inputs[0].contents.fp32_contents[-1]
    error = _error(stub.ModelInfer, req)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, f"[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
                                          f"for model 'identity_batch'. Expected {4 * n}, got {4 * n - 4}")


def test_a_request_of_many_parameters_is_decoded_off_the_hub(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """10,000 request parameters are more decode work than the hub takes (v2_grpc.decode_work): decoded
    on a native thread, with the same answer; a bad one among them is refused alike."""
    req = _request()
    for i in range(10_000):
        req.parameters[f"k{i}"].string_param = "v"
    np.testing.assert_array_equal(_outputs(stub.ModelInfer(req, timeout=60))["OUTPUT0"], [0, 2, 4, 6])
    req.parameters["priority"].string_param = "high"  # must be an unsigned integer
    error = _error(stub.ModelInfer, req)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "priority" in error.details()


def test_verbose_logging_writes_no_header_values(tmp_path: Path, start_server) -> None:
    """With verbose logging (a flag, or any client's log_verbose_level), hpack's DEBUG logger wrote every
    decoded header, so other clients' credentials landed in the log (review finding 8)."""
    (tmp_path / "repo").mkdir()
    server = start_server(tmp_path / "repo", flags=("--log-verbose", "1"))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_live(headers={"authorization": "Bearer SECRET-TOKEN-123"})
        assert client.is_server_ready()  # a second call: the first one's lines are written by then
    finally:
        client.close()
    assert "SECRET-TOKEN" not in server.log()


def test_a_status_message_echoing_a_huge_name_is_truncated(example_server: ServerProcess) -> None:
    """A 100 KB model name came back whole in grpc-message: past grpcio's header-list limit, the client
    saw RESOURCE_EXHAUSTED instead of the real answer. The message is now cut at 2048 characters."""
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.get_model_metadata("m" * 100_000)
    finally:
        client.close()
    assert e.value.status() == "StatusCode.NOT_FOUND", e.value
    assert e.value.message().endswith("... (truncated)") and len(e.value.message()) < 2100

"""``--grpc-infer-response-compression-level`` (Triton's flag): ModelInfer and ModelStreamInfer answers go
out in the coding grpc-core picks for the level from the client's ``grpc-accept-encoding``; a message
that does not shrink goes as it is (flag 0); other calls, and the level ``none``, are never compressed.
A raw HTTP/2 client shows the wire; the official tritonclient shows that clients read it unchanged."""

from __future__ import annotations

import zlib
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from .server import IDENTITY_CONFIG, IDENTITY_PY, add_model
from .test_grpc_transport import _PREFACE, _connect, _frame, _read_frames


def _raw_call(server, path: str, message: bytes, accept: str | None) -> tuple[dict, list[tuple[int, bytes]], dict]:
    """(response head, [(flag, payload)] of the messages, trailers) of one call on a raw connection."""
    fields = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", path),
              ("content-type", "application/grpc"), ("te", "trailers")]
    if accept is not None:
        fields.append(("grpc-accept-encoding", accept))
    with _connect(server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, hpack.Encoder().encode(fields))
                     + _frame(0, 1, 1, b"\0" + len(message).to_bytes(4, "big") + message))
        frames = _read_frames(sock, until=1, flags=1, timeout=30)
    decoder = hpack.Decoder()
    heads = [dict(decoder.decode(p)) for t, _, sid, p in frames if t == 1 and sid == 1]
    data = b"".join(p for t, _, sid, p in frames if t == 0 and sid == 1)
    messages = []
    while data:
        length = int.from_bytes(data[1:5], "big")
        messages.append((data[0], data[5:5 + length]))
        data = data[5 + length:]
    return heads[0], messages, heads[-1]


def _request(values: np.ndarray) -> bytes:
    req = pb.ModelInferRequest(model_name="identity")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[values.size])
    req.raw_input_contents.append(values.astype(np.float32).tobytes())
    return req.SerializeToString()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    add_model(path, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    return path


@pytest.mark.parametrize(("level", "accept", "coding"), [
    ("high", "identity,deflate,gzip", "deflate"), ("medium", "identity,deflate,gzip", "deflate"),
    ("low", "identity,deflate,gzip", "gzip"), ("high", "identity,gzip", "gzip"), ("high", "identity", None),
    ("high", None, None), ("none", "identity,deflate,gzip", None),
])
def test_answers_take_the_coding_of_the_level(repo: Path, start_server, level: str, accept: str | None,
                                              coding: str | None) -> None:
    server = start_server(repo, flags=("--grpc-infer-response-compression-level", level))
    zeros = np.zeros(4096, np.float32)  # 16 KiB of zeros: shrinks
    head, messages, trailers = _raw_call(server, "/inference.GRPCInferenceService/ModelInfer", _request(zeros), accept)
    assert trailers["grpc-status"] == "0" and head.get("grpc-encoding") == coding
    (flag, payload), = messages
    if coding is not None:
        assert flag == 1 and len(payload) < 4096
        payload = zlib.decompress(payload, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
    else:
        assert flag == 0
    answer = pb.ModelInferResponse.FromString(payload)
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == zeros.tolist()


def test_a_message_that_does_not_shrink_goes_as_it_is_and_other_calls_are_never_compressed(
        repo: Path, start_server) -> None:
    server = start_server(repo, flags=("--grpc-infer-response-compression-level", "high"))
    noise = np.frombuffer(np.random.default_rng(7).bytes(64), np.float32)
    head, messages, _ = _raw_call(server, "/inference.GRPCInferenceService/ModelInfer", _request(noise), "gzip,deflate")
    assert head["grpc-encoding"] == "deflate" and messages[0][0] == 0
    head, messages, _ = _raw_call(server, "/inference.GRPCInferenceService/ServerMetadata",
                                  pb.ServerMetadataRequest().SerializeToString(), "gzip,deflate")
    assert "grpc-encoding" not in head and messages[0][0] == 0


def test_tritonclient_reads_compressed_answers_unary_and_streamed(repo: Path, start_server) -> None:
    server = start_server(repo, flags=("--grpc-infer-response-compression-level", "high"))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = np.arange(100_000, dtype=np.float32) % 7  # 400 KB that compress: on a thread (over 256 KiB)
    x = grpcclient.InferInput("INPUT0", [values.size], "FP32")
    x.set_data_from_numpy(values)
    assert client.infer("identity", [x]).as_numpy("OUTPUT0").tolist() == values.tolist()
    import queue

    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for _ in range(3):
        client.async_stream_infer("identity", [x])
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == values.tolist()
    client.stop_stream()
    client.close()

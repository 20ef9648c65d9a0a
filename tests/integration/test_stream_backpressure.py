"""Streamed responses to a client that reads slowly, or not at all, are bounded (review finding 7).

A decoupled model ``flood`` sends COUNT responses of SIZE bytes as fast as it can; after each ``send()``
returns it writes how many did to ``<id>.sent``, and at the end ``<id>.done`` ("<sent> <cancelled>").
A client that never reads (a gRPC stream with a zero flow-control window, an HTTP ``generate_stream``
whose socket is not read) must make the model's ``send()`` wait once the server holds its bound of
responses (``/status.json`` ``streams``: 1024 responses or 4 MiB per request), not let it send them all
into memory; when the client goes away the model must go on at once and see ``is_cancelled()``; a
client that reads slowly must get every response, in order. No sleeps: the tests wait on what the
server reports and on the model's files. Python models in-process, and in a process of their own.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import time
import urllib.request
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from .model_control import wait_for
from .server import ServerProcess, add_model
from .test_grpc_transport import _PREFACE, _frame

BOUND_RESPONSES = 1024  # STREAM_MAX_RESPONSES (runtime/response_channel.py)
BOUND_BYTES = 4 << 20  # STREAM_MAX_BYTES
ISOLATION = pytest.mark.parametrize("flags", [(), ("--backend-config=python,isolation=process",)],
                                    ids=["in_process", "isolated"])

FLOOD_PY = """
import json, os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _wait_for(path):
    for _ in range(2000):  # 20 s
        if os.path.exists(path):
            return True
        time.sleep(0.01)  # model code polling a file the test writes
    return False


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.dir = parameters["dir"]["string_value"]
        self.threaded = "threaded" in parameters  # each request on a thread of its own: several streams at once

    def execute(self, requests):
        for request in requests:
            if self.threaded:
                threading.Thread(target=self._answer, args=(request,), daemon=True).start()
            else:
                self._answer(request)
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
        size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy().reshape(-1)[0])
        rid = request.request_id() or "anonymous"
        path = os.path.join(self.dir, rid)
        gate = json.loads(request.parameters()).get("gate")  # wait for this file before response gate_at
        sent = 0
        for i in range(count):
            if gate and i == json.loads(request.parameters())["gate_at"] and not _wait_for(gate):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("the gate never opened")))
                break
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(size, i % 251, np.uint8)),
                                                    pb_utils.Tensor("INDEX", np.array([i], np.int32))]))
            sent += 1
            _write(path + ".sent", str(sent))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        _write(path + ".done", f"{sent} {sender.is_cancelled()}")
        pb_utils.Logger.log_info(f"flood answered {rid}")
"""


def _flood_repo(tmp_path: Path, parameters: str = "") -> tuple[Path, Path]:
    """``parameters``: more entries of the model's config parameters (``threaded``, the isolation)."""
    repo, out = tmp_path / "repo", tmp_path / "out"
    out.mkdir()
    add_model(repo, "flood", f"""
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }},
                {{ name: "SIZE", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] }},
                 {{ name: "INDEX", data_type: TYPE_INT32, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters [ {{ key: "dir" value: {{ string_value: "{out}" }} }} {parameters} ]
        """, FLOOD_PY)
    return repo, out


def _streams(server: ServerProcess) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:
        return json.loads(answer.read()).get("streams", {})


def _blocked_or_done(server: ServerProcess, out: Path, rid: str) -> dict:
    """Wait until the server reports a model's send() waiting, or the model sent everything (what it
    did before the fix); the server's ``streams`` then."""
    seen: dict = {}

    def settled() -> bool:
        seen.update(_streams(server))
        return seen.get("waiting_senders", 0) > 0 or (out / f"{rid}.done").exists()

    wait_for(settled, timeout=60, what="the model to wait for the client, or to finish")
    return seen


def _assert_held_back(server: ServerProcess, out: Path, rid: str, count: int, size: int, slack: int = 4) -> None:
    streams = _blocked_or_done(server, out, rid)
    sent = int((out / f"{rid}.sent").read_text())
    bound = min(BOUND_RESPONSES, BOUND_BYTES // (size + 4) + 1)  # responses the server holds at most
    # one response taken by the front end (being written), the bound in the channel, the one that waits;
    # ``slack`` more for a pipe's buffer (a model in a process of its own) or the sockets' buffers (HTTP)
    assert sent <= bound + slack, f"the model sent {sent} of {count} responses to a client that reads none"
    assert not (out / f"{rid}.done").exists()
    assert streams["waiting_senders"] == 1 and streams["responses"] <= bound
    assert streams["bytes"] <= BOUND_BYTES + size + 4  # the bound, and the response that went over it


def _sent_when_cancelled(out: Path, rid: str) -> int:
    """Wait for the model to end request ``rid``; it must have seen it cancelled. How many it sent."""
    wait_for(lambda: (out / f"{rid}.done").exists(), timeout=60, what="the model to see the request cancelled")
    sent, cancelled = (out / f"{rid}.done").read_text().split()
    assert cancelled == "True", f"the model sent {sent} responses of {rid} and never saw it cancelled"
    return int(sent)


def _flood_request(rid: str, count: int, size: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="flood", id=rid)
    for name in ("COUNT", "SIZE"):
        t = request.inputs.add()
        t.name, t.datatype = name, "INT32"
        t.shape.extend([1])
    request.raw_input_contents.extend([np.array([count], np.int32).tobytes(), np.array([size], np.int32).tobytes()])
    return request


class _ZeroWindowStream:
    """A raw HTTP/2 connection with one ModelStreamInfer request whose client advertises a zero
    flow-control window: the server may send no response data until :meth:`grant` opens it."""

    def __init__(self, server: ServerProcess, request: pb.ModelInferRequest, *more: pb.ModelInferRequest) -> None:
        host, port = server.grpc_url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                        (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                                        ("content-type", "application/grpc"), ("te", "trailers")])
        bodies = [r.SerializeToString() for r in (request, *more)]
        message = b"".join(struct.pack(">BI", 0, len(body)) + body for body in bodies)
        self.sock.sendall(_PREFACE + _frame(4, 0, 0, struct.pack(">HI", 4, 0)) + _frame(1, 4, 1, block)
                          + _frame(0, 1, 1, message))  # SETTINGS_INITIAL_WINDOW_SIZE = 0; the request, END_STREAM
        self._buf = b""
        self.data = bytearray()  # stream 1's DATA payloads, in order
        self.trailers = False

    def grant(self, n: int) -> None:
        self.sock.sendall(_frame(8, 0, 1, struct.pack(">I", n)) + _frame(8, 0, 0, struct.pack(">I", n)))

    def read(self) -> int:
        """Read what arrived (at least one chunk); answer SETTINGS and PING; the DATA bytes read."""
        chunk = self.sock.recv(1 << 20)
        assert chunk, "the server closed the connection"
        self._buf += chunk
        got = 0
        while len(self._buf) >= 9:
            length_type, flags, sid = struct.unpack_from(">IBI", self._buf)
            length, ftype = length_type >> 8, length_type & 0xFF
            if len(self._buf) < 9 + length:
                break
            payload, self._buf = self._buf[9:9 + length], self._buf[9 + length:]
            if ftype == 0 and sid == 1:
                self.data += payload
                got += length
            elif ftype == 1 and sid == 1 and flags & 1:
                self.trailers = True
            elif ftype == 4 and not flags & 1:
                self.sock.sendall(_frame(4, 1, 0))
            elif ftype == 6 and not flags & 1:
                self.sock.sendall(_frame(6, 1, 0, payload))
        return got

    def responses(self) -> list[pb.ModelStreamInferResponse]:
        out, view = [], bytes(self.data)
        while view:
            length = struct.unpack_from(">I", view, 1)[0]
            out.append(pb.ModelStreamInferResponse.FromString(view[5:5 + length]))
            view = view[5 + length:]
        return out

    def close(self) -> None:
        self.sock.close()


def stream_of(server: ServerProcess, rid: str, count: int, size: int, timeout: float = 30) -> float:
    """Seconds a gRPC stream of ``flood`` took to get its ``count`` responses of ``size`` bytes, in
    order (it fails after ``timeout`` s)."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        inputs = []
        for name, value in (("COUNT", count), ("SIZE", size)):
            x = grpcclient.InferInput(name, [1], "INT32")
            x.set_data_from_numpy(np.array([value], np.int32))
            inputs.append(x)
        start = time.monotonic()
        client.async_stream_infer("flood", inputs, request_id=rid)
        answers = []
        for _ in range(count):
            try:
                answers.append(got.get(timeout=max(0.1, start + timeout - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"stream {rid!r} got {len(answers)} of {count} responses in {timeout} s") from None
        took = time.monotonic() - start
        assert [error for _, error in answers] == [None] * count
        assert [int(result.as_numpy("INDEX")[0]) for result, _ in answers] == list(range(count))
        return took
    finally:
        client.stop_stream()
        client.close()


def _assert_serves_again(server: ServerProcess) -> None:
    """The instance is not stuck: a new stream gets its three responses."""
    stream_of(server, "again", 3, 8)


@ISOLATION
@pytest.mark.parametrize("leaves", ["closes", "resets"])
def test_a_grpc_client_that_reads_nothing_holds_back_the_model(tmp_path: Path, start_server, flags: tuple[str, ...],
                                                               leaves: str) -> None:
    """The reviewer's case (smaller): a stream with a zero window. The model waits at the bound; once
    the client closes its connection or resets the stream, it goes on at once (not after the 60 s
    window_timeout) and sees the request cancelled; the instance serves the next request."""
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo, flags=flags)
    count = 400
    stream = _ZeroWindowStream(server, _flood_request("noread", count, 64 << 10))
    try:
        _assert_held_back(server, out, "noread", count, 64 << 10)
        if leaves == "resets":
            stream.sock.sendall(_frame(3, 0, 1, struct.pack(">I", 8)))  # RST_STREAM CANCEL
    finally:
        if leaves == "closes":
            stream.close()
    wait_for(lambda: (out / "noread.done").exists(), timeout=30, what="the model to be released")
    sent, cancelled = (out / "noread.done").read_text().split()
    assert int(sent) < count and cancelled == "True"
    assert _streams(server)["waiting_senders"] == 0
    _assert_serves_again(server)
    stream.close()


@ISOLATION
def test_a_grpc_client_that_stops_reading_frees_the_instance(tmp_path: Path, start_server,
                                                             flags: tuple[str, ...]) -> None:
    """A gRPC stream that keeps a zero window and stays open: once it took nothing for STREAM_STALL_SECS
    (10 s) while the model waited, the request is cancelled and the instance serves others, well before
    the 60 s window_timeout (which, before, was what released the model; isolated, the model's send
    waits in its own process and says so every 2 s, and the cancel crosses back as a client's does)."""
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo, flags=flags)
    count = 400
    stream = _ZeroWindowStream(server, _flood_request("stalled", count, 64 << 10))
    try:
        _assert_held_back(server, out, "stalled", count, 64 << 10)
        wait_for(lambda: (out / "stalled.done").exists(), timeout=40, what="the stalled request to be cancelled")
        sent, cancelled = (out / "stalled.done").read_text().split()
        assert int(sent) < count and cancelled == "True"
        _assert_serves_again(server)
    finally:
        stream.close()


@ISOLATION
def test_the_requests_of_a_stream_share_one_bound(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """Eight requests on one stream that reads nothing, each answered on a thread of its own: together
    they hold the stream's bound (all of a stream's responses wait behind its one HTTP/2 window), not
    eight times it (a stream of 128 requests held 512 MiB; isolated, each request had the whole window
    as credit of its own: 512 responses); the client leaving releases every one."""
    repo, out = _flood_repo(tmp_path, ', { key: "threaded" value: { string_value: "1" } }')
    server = start_server(repo, flags=flags)
    size, rids = 64 << 10, [f"r{i}" for i in range(8)]
    stream = _ZeroWindowStream(server, *(_flood_request(rid, 400, size) for rid in rids))
    try:
        seen: dict = {}

        def settled() -> bool:
            seen.update(_streams(server))
            return seen.get("waiting_senders", 0) == len(rids) or all((out / f"{r}.done").exists() for r in rids)

        wait_for(settled, timeout=60, what="every request's model thread to wait, or to finish")
        sent = sum(int((out / f"{rid}.sent").read_text()) for rid in rids if (out / f"{rid}.sent").exists())
        bound = BOUND_BYTES // (size + 4) + 1
        assert sent <= bound + 2 * len(rids), f"the stream's requests sent {sent} responses to a client that reads none"
        assert seen["bytes"] <= BOUND_BYTES + len(rids) * (size + 4)
    finally:
        stream.close()
    for rid in rids:
        _sent_when_cancelled(out, rid)
    assert _streams(server)["waiting_senders"] == 0
    _assert_serves_again(server)


@ISOLATION
def test_a_slow_grpc_reader_gets_every_response_in_order(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """The window opens only as the client reads: the model waits again and again (isolated: for the
    credits its process is granted as the client takes responses), and nothing is lost or reordered."""
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo, flags=flags)
    count, size = 600, 16 << 10  # 10 MB: the model waits after about 256
    stream = _ZeroWindowStream(server, _flood_request("slow", count, size))
    try:
        _assert_held_back(server, out, "slow", count, size)
        stream.grant(64 << 10)
        while not stream.trailers:
            got = stream.read()
            if got:
                stream.grant(got)  # only what was read: a reader that keeps the server waiting
        responses = stream.responses()
    finally:
        stream.close()
    assert [r.error_message for r in responses] == [""] * count
    indices = [int(np.frombuffer(r.infer_response.raw_output_contents[1], np.int32)[0]) for r in responses]
    assert indices == list(range(count))
    for i, r in enumerate(responses):
        assert r.infer_response.raw_output_contents[0] == bytes([i % 251]) * size
    assert (out / "slow.done").read_text() == f"{count} False"


def _generate_stream(server: ServerProcess, rid: str, count: int, size: int) -> socket.socket:
    """A raw ``generate_stream`` request from a socket with a small receive buffer, not read."""
    host, port = server.url.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    body = json.dumps({"COUNT": count, "SIZE": size, "id": rid}).encode()
    sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def test_an_http_client_that_reads_no_events_holds_back_the_model(tmp_path: Path, start_server) -> None:
    """The same over HTTP: generate_stream's events (about 230 KB each here) fill the socket's buffers,
    then the bound; the model waits until the client leaves."""
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo)
    count = 600
    sock = _generate_stream(server, "sse", count, 64 << 10)
    try:
        _assert_held_back(server, out, "sse", count, 64 << 10, slack=40)  # the socket buffers: 4 MB at most
    finally:
        sock.close()
    wait_for(lambda: (out / "sse.done").exists(), timeout=30, what="the model to be released")
    sent, cancelled = (out / "sse.done").read_text().split()
    assert int(sent) < count and cancelled == "True"
    _assert_serves_again(server)


@ISOLATION
def test_an_http_client_that_stops_reading_frees_the_instance(tmp_path: Path, start_server,
                                                              flags: tuple[str, ...]) -> None:
    """A generate_stream client that stops reading and stays connected: once it took nothing for
    STREAM_STALL_SECS while the model waited, the request is cancelled and the instance serves others
    with the client still there (before, the model waited until the send timeout, here 600 s)."""
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo, flags=("--http-send-timeout-secs", "600", *flags))
    count = 600
    sock = _generate_stream(server, "stalled", count, 64 << 10)
    try:
        _assert_held_back(server, out, "stalled", count, 64 << 10, slack=40)
        wait_for(lambda: (out / "stalled.done").exists(), timeout=60, what="the stalled request to be cancelled")
        sent, cancelled = (out / "stalled.done").read_text().split()
        assert int(sent) < count and cancelled == "True"
        assert _streams(server)["waiting_senders"] == 0
        _assert_serves_again(server)
    finally:
        sock.close()


def test_a_slow_http_reader_gets_every_event_in_order(tmp_path: Path, start_server) -> None:
    repo, out = _flood_repo(tmp_path)
    server = start_server(repo)
    count, size = 600, 16 << 10  # 33 MB of events: more than the socket buffers and the bound hold
    sock = _generate_stream(server, "slow_sse", count, size)
    try:
        _assert_held_back(server, out, "slow_sse", count, size, slack=count)  # the socket buffers take many small events
        received = bytearray()
        while not received.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(4096)  # a little at a time
            assert chunk, "the server closed the connection"
            received += chunk
    finally:
        sock.close()
    body, parts, at = bytes(received), [], bytes(received).index(b"\r\n\r\n") + 4
    while True:  # chunked transfer coding
        end = body.index(b"\r\n", at)
        n = int(body[at:end], 16)
        if n == 0:
            break
        parts.append(body[end + 2:end + 2 + n])
        at = end + 4 + n
    text = b"".join(parts)
    events = [json.loads(e[len(b"data: "):]) for e in text.split(b"\n\n") if e]
    assert [e["INDEX"] for e in events] == list(range(count))
    assert all(e["OUT"] == [i % 251] * size for i, e in enumerate(events))
    assert (out / "slow_sse.done").read_text() == f"{count} False"


@ISOLATION
def test_a_decoupled_ensemble_holds_back_its_step_for_a_client_that_reads_nothing(tmp_path: Path, start_server,
                                                                                 flags: tuple[str, ...]) -> None:
    """An ensemble answers on the hub, where a send never waits: its step's reader stops reading the
    composing model while the ensemble's stream is full, and the model then waits at its own bound."""
    repo, out = _flood_repo(tmp_path)
    (repo / "flood_ens" / "1").mkdir(parents=True)
    (repo / "flood_ens" / "config.pbtxt").write_text("""
platform: "ensemble"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }, { name: "SIZE", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] }, { name: "INDEX", data_type: TYPE_INT32, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "flood" model_version: -1
  input_map { key: "COUNT" value: "COUNT" } input_map { key: "SIZE" value: "SIZE" }
  output_map { key: "OUT" value: "OUT" } output_map { key: "INDEX" value: "INDEX" } } ] }
""")
    server = start_server(repo, flags=flags)
    count = 6000
    request = _flood_request("ens", count, 8)
    request.model_name = "flood_ens"
    stream = _ZeroWindowStream(server, request)
    try:
        _blocked_or_done(server, out, "ens")
        sent = int((out / "ens.sent").read_text())
        # the ensemble's stream to half its bound (then the reader waits), the step's channel to its bound
        assert sent <= BOUND_RESPONSES // 2 + BOUND_RESPONSES + 8, f"the model sent {sent} of {count}"
        assert not (out / "ens.done").exists()
    finally:
        stream.close()
    wait_for(lambda: (out / "ens.done").exists(), timeout=30, what="the model to be released")
    sent_at_end, cancelled = (out / "ens.done").read_text().split()
    assert int(sent_at_end) < count and cancelled == "True"


HOLDER_PY = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        gate = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gate")
        out = []
        for request in requests:
            ask = pb_utils.InferenceRequest(model_name="flood", request_id="bls", requested_output_names=["INDEX"],
                                            inputs=[pb_utils.Tensor("COUNT", np.array([5000], np.int32)),
                                                    pb_utils.Tensor("SIZE", np.array([1], np.int32))])
            responses = ask.exec(decoupled=True)
            for _ in range(6000):  # the test opens the gate once it saw the target held back (or done)
                if os.path.exists(gate):
                    break
                time.sleep(0.01)  # model code polling a file
            first = [int(pb_utils.get_output_tensor_by_name(next(responses), "INDEX").as_numpy()[0])
                     for _ in range(3)]
            del responses  # dropped unread: the target is cancelled
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("FIRST", np.array(first, np.int32))]))
        return out
"""


def test_a_bls_caller_that_does_not_read_holds_back_its_decoupled_target(tmp_path: Path) -> None:
    """``exec(decoupled=True)`` pumped the target's responses into the caller's inbox without a bound: a
    model that asked for 2000 responses of 1 MB and read none held 2 GB, and one that dropped the
    iterator and returned left the target filling memory (second probe). Now the pump waits while the
    caller has not taken the stream's bound, so the target's send() waits; dropping the iterator
    cancels the target."""
    repo, out = _flood_repo(tmp_path)
    add_model(repo, "holder", """
        backend: "python"
        max_batch_size: 0
        input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
        output [ { name: "FIRST", data_type: TYPE_INT32, dims: [ 3 ] } ]
        """, HOLDER_PY)
    server = ServerProcess(repo).wait_ready()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        results: queue.Queue = queue.Queue()
        client.async_infer("holder", [x], lambda result, error: results.put((result, error)))
        _blocked_or_done(server, out, "bls")
        sent = int((out / "bls.sent").read_text())
        assert not (out / "bls.done").exists() and sent <= 2 * BOUND_RESPONSES + 4, sent  # before: all 5000
        (repo / "gate").write_text("open")
        result, error = results.get(timeout=60)
        assert error is None and result.as_numpy("FIRST").tolist() == [0, 1, 2]
        assert _sent_when_cancelled(out, "bls") < 5000
    finally:
        client.close()
        server.stop()


# awaits ``async_exec(decoupled=True)`` on ``flood``; MODE picks what it does with the iterator (see the tests)
ASYNC_HOLDER_PY = """
import asyncio, json, os
import numpy as np
import triton_python_backend_utils as pb_utils


def index(response):
    return int(pb_utils.get_output_tensor_by_name(response, "INDEX").as_numpy()[0])


def ask(rid, count, size, **parameters):
    return pb_utils.InferenceRequest(model_name="flood", request_id=rid, parameters=parameters,
                                     inputs=[pb_utils.Tensor("COUNT", np.array([count], np.int32)),
                                             pb_utils.Tensor("SIZE", np.array([size], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]

    async def execute(self, requests):
        out = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            result = await getattr(self, mode)()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(result).encode()],
                                                                                    dtype=object))]))
        return out

    async def hold(self):  # read 3 of 2000 x 1 MiB, wait for the test's gate, drop the rest unread
        responses = await ask("ahold", 2000, 1 << 20).async_exec(decoupled=True)
        first = [index(next(responses)) for _ in range(3)]
        gate = os.path.join(self.dir, "ahold.gate")
        for _ in range(6000):
            if os.path.exists(gate):
                break
            await asyncio.sleep(0.01)  # model code polling a file
        del responses
        return first

    async def drop(self):  # read 3 of 5000, drop the iterator and return at once
        responses = await ask("adrop", 5000, 1).async_exec(decoupled=True)
        first = [index(next(responses)) for _ in range(3)]
        del responses
        return first

    async def abandon(self):  # give up on the future before the target's first response
        go = os.path.join(self.dir, "aabandon.go")
        try:
            await asyncio.wait_for(ask("aabandon", 5000, 1, gate=go, gate_at=0).async_exec(decoupled=True), 0.2)
            timed_out = False
        except asyncio.TimeoutError:
            timed_out = True
        open(go, "w").close()
        return timed_out

    async def forget(self):  # never await the future
        ask("aforget", 5000, 1).async_exec(decoupled=True)
        return True

    async def all(self):  # read every one of 3000 x 4 KiB: the target sends the second once the first is read
        go = os.path.join(self.dir, "aall.go")
        responses = await ask("aall", 3000, 4096, gate=go, gate_at=1).async_exec(decoupled=True)
        first = next(responses)
        open(go, "w").close()
        seen, errors, last_empty = [index(first)], [], False
        contents = first.output_tensors()[0].as_numpy().tolist() == [0] * 4096
        for response in responses:
            if response.has_error():
                errors.append(response.error().message())
            elif not response.output_tensors():
                last_empty = True
            else:
                i = index(response)
                seen.append(i)
                out = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
                contents = contents and out.shape == (4096,) and bool((out == i % 251).all())
        return {"count": len(seen), "in_order": seen == list(range(3000)), "contents": contents,
                "last_empty": last_empty, "errors": errors}
"""


def _async_holder_repo(tmp_path: Path, name: str = "async_holder", source: str = ASYNC_HOLDER_PY,
                       parameters: str = "") -> tuple[Path, Path]:
    """``flood`` and a model ``name`` with a MODE input, an OUT output and the out dir as parameter
    ``dir`` (``parameters``: more entries)."""
    repo, out = _flood_repo(tmp_path)
    add_model(repo, name, f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] }} ]
        output [ {{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }} ]
        instance_group [ {{ count: 1, kind: KIND_CPU }} ]
        parameters [ {{ key: "dir" value: {{ string_value: "{out}" }} }} {parameters} ]
        """, source)
    return repo, out


def _mode(mode: str) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("MODE", [1], "BYTES")
    x.set_data_from_numpy(np.array([mode.encode()], dtype=object))
    return [x]


def _answer(result: grpcclient.InferResult) -> object:
    return json.loads(result.as_numpy("OUT")[0])


def _rss_mb(server: ServerProcess) -> float:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_bls_async_caller_that_reads_a_few_holds_back_its_decoupled_target(tmp_path: Path) -> None:
    """Awaiting ``async_exec(decoupled=True)`` gave a list that the hub had collected of every response
    first: a model that asked for 2000 responses of 1 MiB held 2 GB before it could read one. Now it
    gives exec's streamed iterator, bounded the same way: the target's send() waits while the model has
    not taken 1024 responses or 4 MiB; the iterator dropped unread cancels the target."""
    repo, out = _async_holder_repo(tmp_path)
    server = ServerProcess(repo).wait_ready()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        rss_before = _rss_mb(server)
        results: queue.Queue = queue.Queue()
        client.async_infer("async_holder", _mode("hold"), lambda result, error: results.put((result, error)))
        _blocked_or_done(server, out, "ahold")
        sent, grown = int((out / "ahold.sent").read_text()), _rss_mb(server) - rss_before
        # 3 read, the pump's 4 MiB and the channel's (a 1 MiB response over the bound goes alone), one waiting
        assert not (out / "ahold.done").exists() and sent <= 3 + 2 * 5 + 4, sent  # before: all 2000
        assert grown < 128, f"the server grew by {grown:.0f} MB"  # before: about 2000
        (out / "ahold.gate").write_text("open")
        result, error = results.get(timeout=60)
        assert error is None and _answer(result) == [0, 1, 2]
        assert _sent_when_cancelled(out, "ahold") < 2000
    finally:
        client.close()
        server.stop()


def test_a_dropped_or_abandoned_async_bls_stream_cancels_its_target(tmp_path: Path) -> None:
    """The iterator of ``async_exec(decoupled=True)`` dropped after 3 responses cancels the target (it
    sent all 5000 before: the hub collected them before the model saw one); so does a future the model
    stopped waiting for (``asyncio.wait_for``) before the first response came, or never awaited."""
    repo, out = _async_holder_repo(tmp_path)
    server = ServerProcess(repo).wait_ready()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert _answer(client.infer("async_holder", _mode("drop"))) == [0, 1, 2]
        assert _sent_when_cancelled(out, "adrop") <= 2 * BOUND_RESPONSES + 4  # before: all 5000, not cancelled
        assert _answer(client.infer("async_holder", _mode("abandon"))) is True
        assert _sent_when_cancelled(out, "aabandon") <= 2 * BOUND_RESPONSES + 4  # before: all 5000, not cancelled
        assert _answer(client.infer("async_holder", _mode("forget"))) is True
        assert _sent_when_cancelled(out, "aforget") <= 2 * BOUND_RESPONSES + 4  # before: all 5000, not cancelled
    finally:
        client.close()
        server.stop()


def test_an_async_bls_stream_yields_every_response_in_order_as_it_comes(tmp_path: Path) -> None:
    """3000 responses of 4 KiB (over both bounds) through ``async_exec(decoupled=True)`` arrive whole and
    in order, then the flags-only final. The target sends the second only once the model read the first:
    the future must give the iterator at the first response, not at the last (before, it waited for all,
    so the target's gate timed out and the model read an error)."""
    repo, _out = _async_holder_repo(tmp_path)
    server = ServerProcess(repo).wait_ready()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        got = _answer(client.infer("async_holder", _mode("all"), client_timeout=120))
        assert got == {"count": 3000, "in_order": True, "contents": True, "last_empty": True, "errors": []}
    finally:
        client.close()
        server.stop()

"""Slow request bodies cannot hold the request memory budget (the hostile-client hole of budget.py).

Before ``--request-body-min-rate``, a client that declared a big body and then trickled a byte within
each body timeout held its reservation for ever: a few of them spent the whole budget, and every other
HTTP request waited in line and got 503 (gRPC: RESOURCE_EXHAUSTED at once). Now a body must average
the minimum rate after the grace, or it is answered 408 (gRPC: DEADLINE_EXCEEDED) and what it held is
freed. Each attacker is a raw socket; a real tritonclient call must then succeed. The tricklers pace
themselves by waiting on their socket, so they stop the moment the server answers.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import gevent
import hpack
import numpy as np
import orjson
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .server import ROOT, ServerProcess
from .test_grpc_transport import _PREFACE, _frame

BUDGET = 2_000_000  # big requests may hold 1,875,000 of it: the last 1/16 is the small requests' lane
DECLARED = 900_000  # two slow clients declaring this much spend all but that lane
GRACE = "1"
FLAGS = ("--request-memory-budget", str(BUDGET), "--http-body-timeout-secs", "5", "--request-body-min-rate", "100000",
         "--request-body-grace-secs", GRACE)
POST = "POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
# the real requests: 200 kB, over the lane's 64 KiB (budget.SMALL_REQUEST), so they need what the slow ones hold
VALUES = np.arange(50_000, dtype=np.float32).reshape(1, -1)


def _inputs(module):  # tritonclient.http or .grpc
    i = module.InferInput("INPUT0", list(VALUES.shape), "FP32")
    i.set_data_from_numpy(VALUES)
    return [i]


def _served(result) -> None:
    assert np.array_equal(result.as_numpy("OUTPUT0"), VALUES)


def _http_infer(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        _served(client.infer("identity_batch", _inputs(httpclient)))
    finally:
        client.close()


def _grpc_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        _served(client.infer("identity_batch", _inputs(grpcclient), client_timeout=30))
    finally:
        client.close()


def _settle(server: ServerProcess) -> None:
    """Round trips through the server's hub (GETs: no body, no budget): it has read what the tricklers
    sent before."""
    probe = httpclient.InferenceServerClient(server.url)
    for _ in range(20):
        assert probe.is_server_live()
    probe.close()


def _trickle(sock: socket.socket, byte: bytes, every: float = 1.0, most: int = 120) -> bytes:
    """Send ``byte`` every ``every`` s until the server answers (or closes); returns what it said."""
    sock.settimeout(every)
    for _ in range(most):
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            sock.sendall(byte)
            continue
        except OSError:
            return b""
        rest = answer
        while rest:  # the answer, up to the server's close
            try:
                rest = sock.recv(65536)
            except OSError:
                break
            answer += rest
        return answer
    raise AssertionError("the server never answered the trickling client")


@contextmanager
def _tricklers(server: ServerProcess, first: bytes, byte: bytes, n: int = 2) -> Iterator[list[gevent.Greenlet]]:
    host, port = server.url.split(":")
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]
    try:
        for sock in socks:
            sock.sendall(first)
        _settle(server)
        yield [gevent.spawn(_trickle, sock, byte) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def test_a_body_that_stops_altogether_is_answered_408(start_server: Callable[..., ServerProcess]) -> None:
    """A client that sends a head and a few body bytes, then nothing: no read ever returns, so no read
    can see the deadline. The reaper wakes the read (an end of file on the OS socket), and the client is
    answered 408 and then closed, not just dropped: gevent's own shutdown cancelled the read with an
    error, which ended the connection without an answer."""
    server = start_server(ROOT / "model_repository", flags=FLAGS)
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"{POST}Content-Length: {DECLARED}\r\n\r\n{{\"in".encode())
        answer = b""
        while chunk := sock.recv(65536):  # up to the server's close (the socket's timeout bounds it)
            answer += chunk
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:300]
    assert "request body too slow" in orjson.loads(body)["error"]
    _http_infer(server)


def test_a_client_that_sends_on_without_reading_still_gets_its_408(start_server: Callable[..., ServerProcess]) -> None:
    """The server lingers after a 408 (FIN, then reads and drops what comes until the client closes):
    closing while the client still sends would answer its next bytes with a reset, which throws the 408
    away in the client's buffers before it reads it."""
    server = start_server(ROOT / "model_repository", flags=FLAGS)
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"{POST}Content-Length: {DECLARED}\r\n\r\n{{".encode())
        for _ in range(30):  # 3 s of a byte every 0.1 s, blind: well past the 1 s grace and the answer
            sock.sendall(b" ")
            gevent.sleep(0.1)  # the client's pace
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:300]


def test_slow_content_length_bodies_no_longer_hold_the_budget(start_server: Callable[..., ServerProcess]) -> None:
    """Two clients declare 1 MB each (the whole budget) and trickle a byte a second, within the body
    timeout: before, every other request waited its body timeout and got 503; now the tricklers are
    answered 408 once the grace is over and the request goes through."""
    server = start_server(ROOT / "model_repository", flags=FLAGS)
    with _tricklers(server, f"{POST}Content-Length: {DECLARED}\r\n\r\n{{".encode(), b" ") as slow:
        _http_infer(server)
        answers = gevent.joinall(slow, timeout=30, raise_error=True)
    for greenlet in answers:
        status, _, body = greenlet.value.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), greenlet.value[:300]
        assert b"Connection: close" in status
        assert "request body too slow" in orjson.loads(body)["error"]
    assert "HTTP request from 127.0.0.1" in server.log() and "request body too slow" in server.log()
    assert "Traceback" not in server.log()


def _pressed_server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """A grace (30 s) and a body timeout (60 s) longer than the client waits (15 s)."""
    flags = ("--request-memory-budget", str(BUDGET), "--request-body-min-rate", "100000",
             "--request-body-grace-secs", "30")
    return start_server(ROOT / "model_repository", flags=flags)


def _answered_408(slow: list[gevent.Greenlet]) -> None:
    for greenlet in gevent.joinall(slow, timeout=30, raise_error=True):
        status, _, body = greenlet.value.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), greenlet.value[:300]
        assert "request body too slow" in orjson.loads(body)["error"]


def test_a_reservation_nobody_uses_goes_to_the_line_within_a_second(
        start_server: Callable[..., ServerProcess]) -> None:
    """Two clients declare 1 MB each (the whole budget) and trickle a byte a second. With the whole
    grace theirs, a real request waited in line for it (30 s here, 10 s by default, and the ~90 such
    connections an attacker kept in line ahead of it pushed it past the body timeout: 503). Now bodies
    that hold what others wait for are pressed (grace 1 s): the tricklers are answered 408 about a
    second after the request joined the line, and it is served long before its client gives up."""
    server = _pressed_server(start_server)
    with _tricklers(server, f"{POST}Content-Length: {DECLARED}\r\n\r\n{{".encode(), b" ") as slow:
        client = httpclient.InferenceServerClient(server.url, network_timeout=15)
        try:  # before: the client's timeout, as the tricklers held the budget for their 30 s grace
            result = client.infer("identity_batch", _inputs(httpclient))
        finally:
            client.close()
        _served(result)
        _answered_408(slow)
    assert "after 1 s" in server.log()  # the pressed grace, in the slow-body line


def test_a_grpc_call_refused_for_room_presses_the_holders(start_server: Callable[..., ServerProcess]) -> None:
    """A gRPC message does not wait in line: it is refused RESOURCE_EXHAUSTED when the budget is spent.
    That refusal presses the HTTP bodies holding the budget as a waiting request does, so the call's
    retry succeeds within seconds instead of after the holders' whole grace."""
    server = _pressed_server(start_server)
    with _tricklers(server, f"{POST}Content-Length: {DECLARED}\r\n\r\n{{".encode(), b" ") as slow:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for attempt in range(16):  # 8 s of retries; before, the budget stayed spent for 30 s
                try:
                    result = client.infer("identity_batch", _inputs(grpcclient), client_timeout=10)
                    break
                except InferenceServerException as e:
                    assert e.status() == "StatusCode.RESOURCE_EXHAUSTED", e
                    assert attempt < 15, "the silent reservations still held the budget after 8 s"
                    time.sleep(0.5)  # the client's retry pace, not a wait for the server
        finally:
            client.close()
        _served(result)
        _answered_408(slow)


def test_a_small_request_never_waits_behind_big_bodies(start_server: Callable[..., ServerProcess]) -> None:
    """The last 1/16 of the budget is for requests of at most 64 KiB (1/1024 of a bigger budget): two
    clients declaring 900 kB hold all the rest and a third waits in line, with no minimum rate (so
    nothing cuts them); an ordinary small request is served at once. Before, it waited in line behind
    them until its client gave up."""
    flags = ("--request-memory-budget", str(BUDGET), "--request-body-min-rate", "0")
    server = start_server(ROOT / "model_repository", flags=flags)
    with _tricklers(server, f"{POST}Content-Length: {DECLARED}\r\n\r\n{{".encode(), b" ", n=3) as slow:
        client = httpclient.InferenceServerClient(server.url, network_timeout=15)
        try:
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                inputs.append(httpclient.InferInput(name, [4], "FP32"))
                inputs[-1].set_data_from_numpy(np.arange(4, dtype=np.float32))
            assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
        finally:
            client.close()
        assert not any(g.ready() for g in slow), "a slow client was answered: nothing should cut them here"


def test_slow_chunked_bodies_reserve_what_they_sent(start_server: Callable[..., ServerProcess]) -> None:
    """A chunked body reserved the most it may be (--http-max-input-size, 64 MiB) before it was read:
    one slow chunked upload spent the whole budget. Now it reserves as its bytes come (16 KiB first),
    so four of them hold a few KiB of the 2 MB and others are served meanwhile, before any of them is
    past the minimum rate's grace."""
    flags = (*FLAGS[:-1], "30")  # a grace the test never reaches
    server = start_server(ROOT / "model_repository", flags=flags)
    first = f"{POST}Transfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n".encode()
    with _tricklers(server, first, b"1\r\n \r\n", n=4) as slow:
        _http_infer(server)  # before: it waited in line for the uploads' budget, then 503 (it raises)
        assert not any(g.ready() for g in slow), "a chunked upload was cut before its grace"


def test_a_slow_but_steady_client_is_served(start_server: Callable[..., ServerProcess]) -> None:
    """A body sent at 200 KB/s, twice the minimum rate, arrives whole and is answered."""
    server = start_server(ROOT / "model_repository", flags=FLAGS)
    body = orjson.dumps({"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [0, 1, 2, 3]}
                                    for n in ("INPUT0", "INPUT1")]})
    body += b" " * (600_000 - len(body))  # JSON allows the blanks: 3 s of sending at 200 KB/s
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"{POST}Content-Length: {len(body)}\r\n\r\n".encode())
        for i in range(0, len(body), 20_000):
            sock.sendall(body[i:i + 20_000])
            time.sleep(0.1)  # the pace under test, not a wait for the server
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:300]
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == [0, 2, 4, 6]


_BLOCK = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
          (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc"), ("te", "trailers")]


def test_slow_grpc_messages_no_longer_hold_the_budget(start_server: Callable[..., ServerProcess]) -> None:
    """Two streams send most of a ~1 MB message at once (with the room reserved ahead, all the budget
    but the small lane between them) and then a DATA frame a second: before, they held it for ever and
    every other big call got RESOURCE_EXHAUSTED; now each is answered DEADLINE_EXCEEDED once the grace
    is over, and the next call succeeds."""
    server = start_server(ROOT / "model_repository", flags=FLAGS)
    enc = hpack.Encoder()
    host, port = server.grpc_url.rsplit(":", 1)
    announced = DECLARED - 10
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        most = struct.pack(">BI", 0, announced) + b"\0" * (announced - 300_000)
        opening = b"".join(_frame(1, 4, sid, enc.encode(_BLOCK)) + _frame(0, 0, sid, most) for sid in (1, 3))
        sock.sendall(_PREFACE + _frame(4, 0, 0) + opening)
        _settle(server)
        trickler = gevent.spawn(_send_every_second, sock, [_frame(0, 0, sid, b"\0") for sid in (1, 3)])
        try:
            frames = _frames_until_ended(sock, {1, 3})
        finally:
            trickler.kill()
        decoder = hpack.Decoder()
        trailers = {sid: dict(decoder.decode(p)) for t, f, sid, p in frames if t == 1}
        assert set(trailers) == {1, 3}, frames
        for fields in trailers.values():
            assert fields["grpc-status"] == "4", fields  # DEADLINE_EXCEEDED
            assert "request body too slow" in fields["grpc-message"].replace("%20", " ")
        _grpc_infer(server)
    assert "gRPC request from 127.0.0.1" in server.log()
    assert "Traceback" not in server.log()


def _send_every_second(sock: socket.socket, frames: list[bytes]) -> None:
    for _ in range(120):
        sock.sendall(b"".join(frames))
        gevent.sleep(1.0)  # the attack's pace


def _frames_until_ended(sock: socket.socket, sids: set[int]) -> list[tuple[int, int, int, bytes]]:
    """The server's frames until each of ``sids`` got a HEADERS frame with END_STREAM (or it closed)."""
    sock.settimeout(30)
    buf, frames, ended = b"", [], set()
    while ended != sids:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + (struct.unpack_from(">I", buf)[0] >> 8):
            length_type, flags, sid = struct.unpack_from(">IBI", buf)
            frames.append((length_type & 0xFF, flags, sid, buf[9:9 + (length_type >> 8)]))
            buf = buf[9 + (length_type >> 8):]
            if length_type & 0xFF == 1 and flags & 1:
                ended.add(sid)
    return frames


def test_an_announced_grpc_message_reserves_only_what_arrives(start_server: Callable[..., ServerProcess]) -> None:
    """A message reserved all it announced from its 5-byte prefix: one stream announcing ~2 MB took the
    whole budget for nothing (and, with the minimum rate, could do it again after each grace). Now it
    holds about what arrived (twice, at most 256 KiB ahead), and other calls are served meanwhile."""
    server = start_server(ROOT / "model_repository", flags=(*FLAGS[:-1], "30"))
    host, port = server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        prefix = struct.pack(">BI", 0, BUDGET - 10)
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, hpack.Encoder().encode(_BLOCK)) + _frame(0, 0, 1, prefix))
        _settle(server)
        _grpc_infer(server)


def test_a_large_grpc_message_must_arrive_within_the_time_of_the_largest_http_body(
        start_server: Callable[..., ServerProcess]) -> None:
    """800 kB sent at once bought 1 + 8 s of trickling at 100 kB/s; with --http-max-input-size 100 kB a
    message gets what the largest HTTP body would (1 + 1 s), so holding its bytes costs as much."""
    server = start_server(ROOT / "model_repository", flags=(*FLAGS, "--http-max-input-size", "100000"))
    host, port = server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        most = struct.pack(">BI", 0, DECLARED) + b"\0" * 800_000
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, hpack.Encoder().encode(_BLOCK)) + _frame(0, 0, 1, most))
        trickler = gevent.spawn(_send_every_second, sock, [_frame(0, 0, 1, b"\0")])
        try:
            frames = _frames_until_ended(sock, {1})
        finally:
            trickler.kill()
    (trailers,) = [dict(hpack.Decoder().decode(p)) for t, _, _, p in frames if t == 1]
    assert trailers["grpc-status"] == "4", trailers
    seconds = float(trailers["grpc-message"].replace("%20", " ").split(" bytes in ")[1].split(" s,")[0])
    assert seconds < 8.0, trailers  # cut by the cap (2 s and a tick), not by the rate (9 s)
    _grpc_infer(server)

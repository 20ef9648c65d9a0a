"""A decoupled model in a process of its own, with a client that reads nothing (``TRITON_ACTOR_ISOLATION``).

Every response of the model's process reaches the server over one pipe, read by one thread. That thread
used to wait, in the request's channel, for a client that did not read; every other request of the
process (their responses, its logs, its BLS answers) then waited behind it until that client read, left,
or its 60 s ``window_timeout`` ended the call. Now the bound of each stream (1024 responses or 4 MiB not
taken) is kept in the model's process with credits (``runtime/stream_credits.py``): the model's
``send()`` for that request waits there, and nothing else does.

The model is test_stream_backpressure.py's ``flood``, isolated, answering each request on a thread of its
own (so that one process serves several streams at once): it sends COUNT responses of SIZE bytes, writes
how many it sent to ``<id>.sent`` after each and ``<id>.done`` ("<sent> <cancelled>") at the end, and
logs "flood answered <id>". No sleeps: the tests
wait on what ``/status.json`` reports and on the model's files, each under a generous timeout.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from .model_control import wait_for
from .test_grpc_transport import _frame
from .test_stream_backpressure import (
    BOUND_BYTES,
    BOUND_RESPONSES,
    _assert_held_back,
    _assert_serves_again,
    _flood_repo,
    _flood_request,
    _streams,
    _ZeroWindowStream,
    stream_of,
)

THREADED_ISOLATED = """, { key: "threaded" value: { string_value: "yes" } },
    { key: "TRITON_ACTOR_ISOLATION" value: { string_value: "process" } }"""


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
def test_a_client_that_reads_nothing_does_not_stall_the_other_streams_of_the_process(tmp_path: Path,
                                                                                     start_server) -> None:
    """Client A's stream has a zero window and the model waits for it; client B's streams to the same
    process are answered at once, its log line comes through, and A is still held back. Before: B got
    nothing until A's 60 s window_timeout (the process's reader thread waited in A's channel)."""
    repo, out = _flood_repo(tmp_path, THREADED_ISOLATED)
    server = start_server(repo)
    count, size = 400, 64 << 10
    a = _ZeroWindowStream(server, _flood_request("a", count, size))
    try:
        _assert_held_back(server, out, "a", count, size)
        took = [stream_of(server, f"b{i}", 3, 8, timeout=20) for i in range(3)]
        assert max(took) < 20, took
        assert server.stderr.wait(lambda: "flood answered b2" in server.stderr.text(), 20), "B's log line"
        sent_a = int((out / "a.sent").read_text())
        assert not (out / "a.done").exists() and _streams(server)["waiting_senders"] == 1  # A still held back
        bigger = stream_of(server, "b_big", 200, 64 << 10, timeout=30)  # more than A's bound: B's own credit
        assert bigger < 30 and int((out / "a.sent").read_text()) == sent_a
        a.sock.sendall(_frame(3, 0, 1, struct.pack(">I", 8)))  # RST_STREAM CANCEL: A leaves
    finally:
        a.close()
    wait_for(lambda: (out / "a.done").exists(), timeout=30, what="A's sender to be released")
    sent, cancelled = (out / "a.done").read_text().split()
    assert int(sent) < count and cancelled == "True"
    wait_for(lambda: _streams(server)["open"] == 0, timeout=30, what="the streams to close")
    _assert_serves_again(server)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("count", "size"), [(5000, 16), (300, 1 << 20)], ids=["responses", "bytes"])
def test_what_the_server_holds_for_an_isolated_client_that_reads_nothing_is_bounded(
        tmp_path: Path, start_server, count: int, size: int) -> None:
    """The child sends exactly the stream's bound (1024 responses, or 4 MiB and the one response that goes
    over it), no more: not a pipe's worth past it; the server's memory does not grow with what the model
    would send (300 x 1 MiB: 300 MB unbounded). The waiting send is released when the client leaves."""
    repo, out = _flood_repo(tmp_path, THREADED_ISOLATED)
    server = start_server(repo)
    stream_of(server, "warm", 3, 8, timeout=30)  # the process started, its first stream served
    rss_before = _rss_bytes(server.proc.pid)
    stream = _ZeroWindowStream(server, _flood_request("noread", count, size))
    try:
        _assert_held_back(server, out, "noread", count, size, slack=0)
        sent = int((out / "noread.sent").read_text())
        assert sent == min(BOUND_RESPONSES, BOUND_BYTES // (size + 4) + 1)  # the window, exactly
        streams = _streams(server)
        assert streams["responses"] <= sent and streams["bytes"] <= BOUND_BYTES + size + 4
        grown = _rss_bytes(server.proc.pid) - rss_before
        assert grown < 64 << 20, f"the server grew by {grown >> 20} MB"
    finally:
        stream.close()
    wait_for(lambda: (out / "noread.done").exists(), timeout=30, what="the model to be released")
    sent_at_end, cancelled = (out / "noread.done").read_text().split()
    assert int(sent_at_end) <= sent + 1 and cancelled == "True"  # the send that waited returned (dropped)
    _assert_serves_again(server)

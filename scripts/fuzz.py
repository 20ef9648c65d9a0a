#!/usr/bin/env python3
"""Coverage-guided fuzzing of the wire code with atheris (libFuzzer for CPython).

Targets (the sans-I/O modules in ``triton_actor/protocol/``, instrumented with ``hpack``):

* ``http1``  — the HTTP/1.1 parser fed any bytes: the first byte is a read size (0: one read), the rest
  the stream; only ``http1.ProtocolError`` may come out, and reads of that size must give what one
  read gives (events and error);
* ``h2``     — the HTTP/2 server state machine fed the client preface and any bytes (first byte: read
  size, as above): nothing may come out of it, its events and bytes out must not depend on the read
  size, and with a driver answering each request (``StreamClosedError`` from a send is allowed)
  nothing may be sent after a GOAWAY for a connection error;
* ``v2json`` — the V2 REST infer request decoder: the first two bytes are the
  Inference-Header-Content-Length (big-endian; 0xFFFF: absent), the rest the body; ``TritonError`` only;
* ``grpc``   — protobuf ``ModelInferRequest`` parse (``DecodeError`` allowed) then decode → InferRequest;
  ``TritonError`` only.

Anything else raised is a crash: libFuzzer writes the input to ``<corpus>-crashes/`` and stops.
Corpora start from valid messages (seeds written when the corpus folder is empty) and grow under
``fuzz_corpus/<target>`` (git-ignored).

    .venv/bin/pip install atheris        # not in any extra, not in CI: a libFuzzer build (Linux wheels)
    .venv/bin/python scripts/fuzz.py http1 --seconds 300
    .venv/bin/python scripts/fuzz.py all --seconds 300 --summary bench_out/fuzz.json
    .venv/bin/python scripts/fuzz.py grpc --reproduce fuzz_corpus/grpc-crashes/crash-...

Progress is libFuzzer's own (``#runs NEW cov: ft: corp: exec/s``); each run ends with a summary line
(executions, exec/s, coverage, features, corpus, crashes). Extra libFuzzer flags follow ``--``.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS = ("http1", "h2", "v2json", "grpc")


# -- the targets (imported under atheris' instrumentation) ------------------------------------------
def _pieces(data: bytes) -> tuple[bytes, list[bytes]]:
    step, rest = (data[0], data[1:]) if data else (0, b"")
    return rest, ([rest[i:i + step] for i in range(0, len(rest), step)] if step else [rest])


def drive_http1(pieces: list[bytes], limits: Any = None) -> list[Any]:
    """Drive an HTTP/1 connection as the server's loop does (also the property tests' driver):
    events until NEED_DATA, a new cycle after each body, the peer's close at the end; the outcome
    is the events and the status of the error that ended them."""
    from triton_actor.protocol import http1

    conn, out = http1.ServerConnection(limits or http1.DEFAULT_LIMITS, now=0.0), []
    try:
        for piece in [*pieces, b""]:
            conn.receive_data(piece, 1.0)
            while (event := conn.next_event()) is not http1.NEED_DATA:
                out.append(event)
                if event is http1.CLOSED:
                    return out
                if isinstance(event, http1.Body):
                    conn.start_next_cycle(1.0)
    except http1.ProtocolError as e:
        out.append(("error", e.status))
    return out


def _make_targets() -> dict[str, Callable[[bytes], None]]:
    from google.protobuf.message import DecodeError

    from triton_actor.errors import TritonError
    from triton_actor.protocol import http1, v2_grpc, v2_http  # imported here to be instrumented
    from triton_actor.protocol import http2 as h2
    from triton_actor.protocol._generated import grpc_service_pb2 as pb
    from triton_actor.protocol.h2_connection import H2Connection
    from triton_actor.protocol.h2_events import DataReceived, StreamClosedError, WindowUpdated

    def fuzz_http1(data: bytes) -> None:
        whole, pieces = _pieces(data)
        assert http1.ServerConnection  # drive_http1 runs the module instrumented above
        if len(pieces) > 1 and drive_http1(pieces) != drive_http1([whole]):
            raise AssertionError("HTTP/1 result depends on how reads fall")

    def run_h2(pieces: list[bytes], answering: bool) -> tuple[list[Any], bytes]:
        """As frontends/grpc_h2.py drives it: consume DATA, answer each request whose body ended
        (when ``answering``), no new work once the connection is closed."""
        conn, log, sent = H2Connection(), [], bytearray()
        conn.initiate_connection()
        for piece in pieces:
            for event in conn.receive_data(piece, 1.0):
                if type(event) is not WindowUpdated:
                    log.append(event)
                if conn.closed:
                    continue
                if isinstance(event, DataReceived):
                    conn.consumed(event.stream)
                if answering and getattr(event, "end_stream", False):
                    try:
                        conn.send_response(event.stream_id, b"\x88", b"\0\0\0\0\1x", b"\x00\x0bgrpc-status\x010")
                    except StreamClosedError:
                        log.append(("closed", event.stream_id))
            sent += conn.data_to_send()
        return log, bytes(sent)

    def fuzz_h2(data: bytes) -> None:
        whole, pieces = _pieces(data)
        if len(pieces) > 1 and run_h2([h2.PREFACE, *pieces], False) != run_h2([h2.PREFACE, whole], False):
            raise AssertionError("HTTP/2 events or bytes out depend on how reads fall")
        sent = run_h2([h2.PREFACE, *pieces], True)[1]
        if conn_error_not_last(sent):
            raise AssertionError("frames sent after a GOAWAY for a connection error")

    def conn_error_not_last(sent: bytes) -> bool:
        pos, error_at, count = 0, None, 0
        while pos + 9 <= len(sent):
            length_type, _, _ = h2.FRAME_HEAD.unpack_from(sent, pos)
            if length_type & 0xFF == h2.GOAWAY and error_at is None and sent[pos + 13:pos + 17] != b"\0\0\0\0":
                error_at = count
            pos += 9 + (length_type >> 8)
            count += 1
        return error_at is not None and error_at != count - 1

    def fuzz_v2json(data: bytes) -> None:
        if len(data) < 2:
            return
        (length,) = struct.unpack(">H", data[:2])
        try:
            v2_http.decode_infer_request(data[2:], None if length == 0xFFFF else length, "m", 1)
        except TritonError:
            pass

    def fuzz_grpc(data: bytes) -> None:
        try:
            msg = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            return
        try:
            v2_grpc.decode_infer_request(msg)
        except TritonError:
            pass

    return {"http1": fuzz_http1, "h2": fuzz_h2, "v2json": fuzz_v2json, "grpc": fuzz_grpc}


# -- seeds: valid messages ----------------------------------------------------------------------------
def _seeds(target: str) -> list[bytes]:
    if target == "http1":
        get = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        post = b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello"
        chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n"
        return [b"\0" + get, b"\0" + post + get, b"\x05" + chunked, b"\x01\r\n" + get + b"GET / HTTP/1.0\r\n\r\n"]
    if target == "h2":
        return [b"\0" + s for s in _h2_seeds()] + [b"\x07" + _h2_seeds()[0]]
    if target == "v2json":
        return [struct.pack(">H", 0xFFFF if n is None else n) + body for body, n in _v2json_seeds()]
    return _grpc_seeds()


def _h2_seeds() -> list[bytes]:
    import hpack

    from triton_actor.protocol import http2 as h2

    head = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                   (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                   ("content-type", "application/grpc"), ("te", "trailers")])
    settings = h2.settings_frame({h2.INITIAL_WINDOW_SIZE: 1 << 20, h2.MAX_FRAME_SIZE: 1 << 15})
    call = (h2.frame(h2.HEADERS, h2.END_HEADERS, 1, head) + h2.frame(h2.DATA, h2.END_STREAM, 1, h2.grpc_message(b"\n\1m")))
    split_head = (h2.frame(h2.HEADERS, 0, 3, head[:10]) + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 3, head[10:])
                  + h2.frame(h2.DATA, h2.PADDED, 3, b"\2ab\0\0") + h2.rst_stream(3, h2.CANCEL))
    control = (h2.frame(h2.PING, 0, 0, b"12345678") + h2.window_update(0, 1000) + h2.frame(h2.SETTINGS, h2.ACK, 0)
               + h2.frame(h2.PRIORITY, 0, 5, b"\0\0\0\0\x10") + h2.goaway(1, 0))
    return [settings + call, settings + split_head + call, settings + control]


def _v2json_seeds() -> list[tuple[bytes, int | None]]:
    import orjson

    seeds: list[tuple[bytes, int | None]] = [(orjson.dumps({"id": "1", "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
        {"name": "B", "datatype": "BYTES", "shape": [2], "data": ["a", ""]},
        {"name": "C", "datatype": "BOOL", "shape": [1], "data": [True]}],
        "outputs": [{"name": "O", "parameters": {"binary_data": True, "classification": 2}}],
        "parameters": {"sequence_id": 5, "sequence_start": True, "priority": 1, "x": "y"}}), None),
        (orjson.dumps({"inputs": [{"name": "I", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]}]}), None)]
    for wire, raw in (("FP16", b"\0<\0<"), ("BYTES", b"\2\0\0\0hi"), ("UINT8", b"\1\2")):
        head = orjson.dumps({"inputs": [{"name": "I", "datatype": wire, "shape": [1, -1 if wire == "BYTES" else 2],
                                         "parameters": {"binary_data_size": len(raw)}}],
                             "parameters": {"binary_data_output": True}})
        seeds.append((head + raw, len(head)))
    return seeds


def _grpc_seeds() -> list[bytes]:
    from triton_actor.protocol._generated import grpc_service_pb2 as pb

    raw = pb.ModelInferRequest(model_name="m", model_version="1", id="r", raw_input_contents=[b"\0" * 8, b"\1\0\0\0x"])
    raw.inputs.add(name="A", datatype="FP32", shape=[1, 2])
    raw.inputs.add(name="B", datatype="BYTES", shape=[1])
    raw.outputs.add(name="O").parameters["classification"].int64_param = 1
    raw.parameters["sequence_id"].int64_param = 7
    raw.parameters["sequence_start"].bool_param = True
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="I", datatype="INT8", shape=[2]).contents.int_contents.extend([1, -2])
    typed.inputs.add(name="S", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
    typed.parameters["x"].string_param = "y"
    return [raw.SerializeToString(), typed.SerializeToString()]


# -- running -------------------------------------------------------------------------------------------
def _worker(args: argparse.Namespace, libfuzzer: list[str]) -> None:
    """In the child: instrument, seed, and hand over to libFuzzer (which exits the process)."""
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: .venv/bin/pip install atheris (Linux x86-64 wheels for CPython 3.8-3.12)")
    with atheris.instrument_imports(include=["triton_actor", "hpack"]):
        targets = _make_targets()
    fn = targets[args.target]
    if args.reproduce:
        fn(Path(args.reproduce).read_bytes())
        print("no crash")
        return
    corpus = Path(args.corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(_seeds(args.target)):
            (corpus / f"seed-{i}").write_bytes(seed)
    crashes = Path(f"{corpus}-crashes")
    crashes.mkdir(exist_ok=True)
    argv = [sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", "-print_final_stats=1",
            f"-artifact_prefix={crashes}/", "-timeout=10", "-rss_limit_mb=2048", "-max_len=8192", *libfuzzer]
    atheris.Setup(argv, fn)
    atheris.Fuzz()


_PROGRESS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+.*?exec/s: (\d+)")
_STAT = re.compile(r"stat::(\w+):\s+(\d+)")


def _campaign(target: str, args: argparse.Namespace, libfuzzer: list[str]) -> dict[str, Any]:
    """Run one target in a child process, echo its progress, and sum it up from libFuzzer's output."""
    corpus = str(Path(args.corpus) / target) if args.corpus and args.target == "all" else \
        args.corpus or str(ROOT / "fuzz_corpus" / target)
    cmd = [sys.executable, __file__, target, "--worker", "--seconds", str(args.seconds), "--corpus", corpus,
           "--", *libfuzzer]
    last: tuple[str, ...] | None = None
    stats: dict[str, int] = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if m := _PROGRESS.search(line):
                last = m.groups()
            if m := _STAT.search(line):
                stats[m.group(1)] = int(m.group(2))
    crashes = sorted(p.name for p in Path(f"{corpus}-crashes").glob("*")) if Path(f"{corpus}-crashes").exists() else []
    summary = {"target": target, "seconds": args.seconds, "exit": proc.returncode,
               "executions": stats.get("number_of_executed_units", int(last[0]) if last else 0),
               "exec_per_s": stats.get("average_exec_per_sec", int(last[4]) if last else 0),
               "cov": int(last[1]) if last else None, "ft": int(last[2]) if last else None,
               "corpus": int(last[3]) if last else None, "new_units": stats.get("new_units_added"),
               "peak_rss_mb": stats.get("peak_rss_mb"), "crashes": crashes}
    print(f"== {target}: {summary['executions']} runs, {summary['exec_per_s']} exec/s, cov {summary['cov']}, "
          f"ft {summary['ft']}, corpus {summary['corpus']}, crashes {len(crashes)} (exit {proc.returncode})", flush=True)
    return summary


def main() -> None:
    argv = sys.argv[1:]
    libfuzzer = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=[*TARGETS, "all"])
    parser.add_argument("--seconds", type=int, default=300, help="per target (libFuzzer -max_total_time)")
    parser.add_argument("--corpus", help="corpus folder (default fuzz_corpus/<target>; with 'all', DIR/<target>); "
                        "crashes go to <corpus>-crashes")
    parser.add_argument("--reproduce", metavar="FILE", help="run the target once on FILE (a crash input)")
    parser.add_argument("--summary", metavar="JSON", help="write the campaign's figures there")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.reproduce:
        if args.target == "all":
            parser.error("--reproduce takes one target")
        args.corpus = args.corpus or str(ROOT / "fuzz_corpus" / args.target)
        _worker(args, libfuzzer)
        return
    results = [_campaign(t, args, libfuzzer) for t in (TARGETS if args.target == "all" else (args.target,))]
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

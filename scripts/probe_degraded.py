#!/usr/bin/env python3
"""Probes of issue 23's degraded and minor cases, on loopback, each a bounded loop (docs/limits.md).

Starts triton_actor on a throw-away repository, runs one probe and prints its figures as JSON:

``stalled-sse``: a decoupled model sends ``--count`` responses of 64 KiB from ``execute`` (one instance) to
a ``generate_stream`` client that never reads; a second client then asks the same model for one response.
Reports how long the second client waited (the instance held by the stalled stream) and the server's RSS.

    .venv/bin/python scripts/probe_degraded.py stalled-sse

``config-override``: a model-load request whose ``config`` parameter is ``--mib`` MiB of JSON; reports
the answer, the server's peak RSS above idle (VmHWM) and the RSS left while the model is loaded.

    .venv/bin/python scripts/probe_degraded.py config-override --mib 100
    .venv/bin/python scripts/probe_degraded.py config-override --mib 3.9 --grpc   # gRPC's RepositoryModelLoad

``framing``: raw HTTP/1 requests with ambiguous framing (what nginx refuses); reports each status line.

    .venv/bin/python scripts/probe_degraded.py framing

``load-errors``: a load request whose ``file:1/model.py`` fails to import; reports whether the answer or
the index names the server's temporary directory. ``status-headers``: the security headers of ``/status``.

    .venv/bin/python scripts/probe_degraded.py load-errors
    .venv/bin/python scripts/probe_degraded.py status-headers
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_hostile import ECHO_CONFIG, ECHO_MODEL, _free_port, _status_kb  # scripts/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
FLOOD_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
FLOOD_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            for i in range(count):
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(65536, i % 251, np.uint8))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
FRAMINGS = {
    "two identical Content-Length": b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                                    b"Content-Length: 4\r\n\r\nabcd",
    "Content-Length: 4, 4": b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 4\r\n\r\nabcd",
    "Transfer-Encoding on HTTP/1.0": b"POST /v2/health/ready HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                     b"\r\n4\r\nabcd\r\n0\r\n\r\n",
    "space after the chunk size": b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                  b"\r\n4 \r\nabcd\r\n0\r\n\r\n",
    "a well-framed chunked body": b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                  b"\r\n4\r\nabcd\r\n0\r\n\r\n",
}


def _request(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _start(repo: str, port: int, flags: list[str]) -> subprocess.Popen:
    grpc_port = _free_port()
    cmd = [sys.executable, "-m", "triton_actor", "--model-repository", repo, "--http-port", str(port),
           "--grpc-port", str(grpc_port), "--allow-metrics", "false", *flags]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.grpc_port = grpc_port  # type: ignore[attr-defined]  # config-override --grpc
    deadline = time.time() + 60
    while True:
        try:
            if _request(port, "GET", "/v2/health/ready", timeout=2)[0] == 200:
                return server
        except OSError:
            pass
        if time.time() > deadline or server.poll() is not None:
            raise SystemExit("server did not come up")
        time.sleep(0.2)


def stalled_sse(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    idle_kb = _status_kb(server.pid, "VmRSS")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"COUNT": args.count}).encode()
    sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    started = time.monotonic()
    status, _ = _request(port, "POST", "/v2/models/flood/generate", json.dumps({"COUNT": 1}).encode())
    waited = time.monotonic() - started
    rss = _status_kb(server.pid, "VmRSS")
    sock.close()
    return {"stalled_stream_responses": args.count, "second_client_status": status,
            "second_client_waited_s": round(waited, 2), "rss_over_idle_mb": (rss - idle_kb) // 1024,
            "peak_rss_over_idle_mb": (_status_kb(server.pid, "VmHWM") - idle_kb) // 1024}


def config_override(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    config = {"backend": "python", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "parameters": {"filler": {"string_value": "x" * int(args.mib * 2**20)}}}
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    idle_kb = _status_kb(server.pid, "VmRSS")
    started = time.monotonic()
    if args.grpc:  # gRPC's RepositoryModelLoad, the same override as a string_param
        status, answer = _grpc_load(server.grpc_port, json.dumps(config))  # type: ignore[attr-defined]
    else:
        status, answer = _request(port, "POST", "/v2/repository/models/plain/load", body)
    took = time.monotonic() - started
    return {"body_mb": round(len(body) / 1e6, 1), "status": status, "answer": answer[:200].decode("utf-8", "replace"),
            "took_s": round(took, 2), "peak_rss_over_idle_mb": (_status_kb(server.pid, "VmHWM") - idle_kb) // 1024,
            "rss_loaded_over_idle_mb": (_status_kb(server.pid, "VmRSS") - idle_kb) // 1024}


def _grpc_load(grpc_port: int, config: str) -> tuple[int, bytes]:
    """A RepositoryModelLoad of ``plain`` with ``config``: (200 or the gRPC status code, the message)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        client.load_model("plain", config=config)
    except InferenceServerException as e:
        return int(e.status() or 0) if str(e.status() or "").isdigit() else 500, str(e).encode()
    finally:
        client.close()
    return 200, b""


def framing(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    answers = {}
    for name, raw in FRAMINGS.items():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(raw)
            answers[name] = sock.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
    return answers


def load_errors(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    """A load request whose model.py fails to import: does the answer or the index name the server's
    temporary folder?"""
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    model = base64.b64encode(b"import no_such_module_for_the_probe\n").decode()
    body = json.dumps({"parameters": {"config": config, "file:1/model.py": model}}).encode()
    status, answer = _request(port, "POST", "/v2/repository/models/plain/load", body)
    _, index = _request(port, "POST", "/v2/repository/index", b"{}")
    tmp = tempfile.gettempdir() + "/"
    return {"status": status, "answer_names_tmp": tmp in answer.decode(), "index_names_tmp": tmp in index.decode(),
            "traceback_line": next((line for line in json.loads(answer)["error"].splitlines()
                                    if "model.py(" in line), "").strip()}


def status_headers(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/status")
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return {name: answer.getheader(name) for name in ("Content-Security-Policy", "X-Content-Type-Options")}


PROBES = {"stalled-sse": stalled_sse, "config-override": config_override, "framing": framing,
          "load-errors": load_errors, "status-headers": status_headers}


def arguments(doc: str | None, probes: dict[str, Any], count: tuple[int, str], mib: tuple[float, str]) -> argparse.Namespace:
    """The command line of a probe script: the probe's name, ``--count`` and ``--mib`` (default, help), ``--flags``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=sorted(probes))
    ap.add_argument("--count", type=int, default=count[0], help=count[1])
    ap.add_argument("--mib", type=float, default=mib[0], help=mib[1])
    ap.add_argument("--flags", default="", help="extra server flags")
    ap.add_argument("--grpc", action="store_true", help="config-override: load over gRPC, not HTTP")
    return ap.parse_args()


def main() -> None:
    args = arguments(__doc__, PROBES, (800, "stalled-sse: responses of 64 KiB the model sends"),
                     (100.0, "config-override: MiB of the override"))
    explicit = args.probe in ("config-override", "load-errors")
    flags = ["--model-control-mode", "explicit", "--load-model", "flood"] if explicit else []
    run(PROBES[args.probe], {"flood": (FLOOD_CONFIG, FLOOD_MODEL),
                             "plain": (ECHO_CONFIG.replace('name: "echo"', ""), ECHO_MODEL)}, flags, args)


def run(probe: Any, models: dict[str, tuple[str, str]], flags: list[str], args: argparse.Namespace) -> None:
    """Start a server on a throw-away repository of ``models`` (name: (config, model.py)) with ``flags``
    and ``--flags``, run ``probe(port, server, args)``, print its figures as JSON, stop the server."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, (config, model) in models.items():
            Path(tmp, name, "1").mkdir(parents=True)
            Path(tmp, name, "config.pbtxt").write_text(config)
            Path(tmp, name, "1", "model.py").write_text(model)
        port = _free_port()
        server = _start(tmp, port, flags + args.flags.split())
        try:
            print(json.dumps(probe(port, server, args), indent=1))
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()

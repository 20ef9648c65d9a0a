"""Where a config override's copies are made while it loads (issue 23: a bounded override still peaked
at several times its size).

Runs a server in this process (explicit mode, an echo Python model named ``plain`` in a temporary
repository, HTTP on port 0), then posts one load of ``plain`` whose ``config`` override carries a string
parameter of ``--mib`` MiB, with :mod:`tracemalloc` on. Reports the Python heap's peak during the load
over what it held before, what it held after (loaded), and, at the moment each version starts (the
config parsed, normalized, its JSON made: ``start_version``) and once loaded, the blocks of at least
``--min-kib`` KiB, by where they were allocated. Usage::

    PYTHONPATH=. python scripts/trace_config_override.py --mib 3.9
    PYTHONPATH=. python scripts/trace_config_override.py --mib 3.9 --grpc   # RepositoryModelLoad

Figures are in multiples of the override's size (the ``config`` string); the HTTP body and its parse,
which any request of that size costs, are in the peak.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import gevent
from bench_hostile import ECHO_CONFIG, ECHO_MODEL  # scripts/ is on sys.path
from gevent import subprocess

from triton_actor import bootstrap  # noqa: F401  (gevent patching before the server modules load)
from triton_actor.actors.model import actor as model_actor
from triton_actor.config.command_line import parse
from triton_actor.server import Server


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _big_blocks(snapshot: tracemalloc.Snapshot, min_bytes: int, size: int) -> list[str]:
    stats = snapshot.statistics("traceback")
    lines = []
    for stat in stats:
        if stat.size < min_bytes:
            continue
        frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback if "tracemalloc" not in f.filename]
        lines.append(f"  {stat.size / size:5.2f} x  {stat.count:4d} blocks  " + " <- ".join(reversed(frames[-6:])))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=3.9, help="MiB of the override's string parameter")
    ap.add_argument("--min-kib", type=int, default=512, help="blocks at least this big are listed")
    ap.add_argument("--flags", default="", help="extra server flags")
    ap.add_argument("--grpc", action="store_true", help="load over gRPC (a client in its own process), not HTTP")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="trace_config_"))
    (root / "plain" / "1").mkdir(parents=True)
    (root / "plain" / "config.pbtxt").write_text(ECHO_CONFIG.replace('name: "echo"', ""))
    (root / "plain" / "1" / "model.py").write_text(ECHO_MODEL)
    settings = parse(["--model-repository", str(root), "--http-port", "0", "--http-address", "127.0.0.1",
                      f"--allow-grpc={args.grpc}", "--grpc-port=0", "--allow-metrics=false", "--model-control-mode=explicit",
                      *args.flags.split()])
    server = Server(settings)
    server.start_actors()
    server.serve()
    server.load_models()
    server.plane.accepting = True

    config = {"backend": "python", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "parameters": {"filler": {"string_value": "x" * int(args.mib * 2**20)}}}
    text = json.dumps(config)
    body = json.dumps({"parameters": {"config": text}}).encode()
    size = len(text)
    del config
    if not args.grpc:
        del text
    min_bytes = args.min_kib << 10
    seen: dict[str, list[str]] = {}
    start_version = model_actor.start_version

    def traced_start(*a: Any, **kw: Any) -> Any:
        seen["at start_version"] = _big_blocks(tracemalloc.take_snapshot(), min_bytes, size)
        return start_version(*a, **kw)

    model_actor.start_version = traced_start  # type: ignore[assignment]
    tracemalloc.start(25)
    before, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS: the peak RSS of the load from here
    rss_before = _status_kib("VmRSS")

    def load() -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
        conn.request("POST", "/v2/repository/models/plain/load", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        conn.close()
        return answer.status, data

    def load_grpc() -> tuple[int, bytes]:  # tritonclient's gRPC needs threading patched: in a child
        client = ("import sys, tritonclient.grpc as g; c = g.InferenceServerClient(sys.argv[1]); "
                  "c.load_model('plain', config=sys.stdin.read())")
        assert server.grpc is not None
        done = subprocess.run([sys.executable, "-c", client, f"127.0.0.1:{server.grpc.server_port}"], input=text,
                              capture_output=True, text=True, check=False)
        return (200 if done.returncode == 0 else 500), done.stderr[-300:].encode()

    status, data = gevent.spawn(load_grpc if args.grpc else load).get()
    after, peak = tracemalloc.get_traced_memory()
    rss_peak, rss_after = _status_kib("VmHWM"), _status_kib("VmRSS")
    seen["loaded"] = _big_blocks(tracemalloc.take_snapshot(), min_bytes, size)
    print(f"override {size / 2**20:.1f} MiB (body {len(body) / 2**20:.1f} MiB): load {status} {data[:120]!r}")
    print(f"RSS: peak {(rss_peak - rss_before) * 1024 / size:.2f} x the override over before the load, "
          f"{(rss_after - rss_before) * 1024 / size:.2f} x once loaded (tracemalloc on: its own tables count too)")
    # tracemalloc counts what was asked of the allocator: orjson reserves room for the worst escaping of a
    # string and touches only what it writes, so its peak is above what the process ever held
    print(f"python heap: peak {(peak - before) / size:.2f} x the override over before the load (reserved, "
          f"not all touched), {(after - before) / size:.2f} x held once loaded")
    for when, lines in seen.items():
        print(f"blocks of {args.min_kib} KiB or more {when}:")
        print("\n".join(lines) or "  none")
    tracemalloc.stop()
    server.stop()


if __name__ == "__main__":
    main()

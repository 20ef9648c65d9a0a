#!/usr/bin/env python3
"""Probes of issue 23's three breaks, on loopback, each a bounded loop (docs/limits.md); prints JSON.

Each starts triton_actor on a throw-away repository (as ``probe_degraded.py``), attacks it, then asks
what a normal client gets, and reports the server's RSS and open descriptors (all its processes).

``sequences``: a sequence model with one slot (1 s idle timeout); one client starts a sequence and goes
away, then ``--count`` clients each send a START of a sequence of their own and close at once (ordinary
client timeouts do this). A fresh START+END sequence must then be answered: reports how long it took
(before the fix it never was: the scheduler stopped dispatching after the first idle release).

    .venv/bin/python scripts/probe_breaks.py sequences --count 300

``shm-regions``: with ``--allow-client-shm=true`` one client registers system shared-memory regions (all
on one POSIX object) until refused, at most ``--count``; reports how many were registered, the refusal,
the server's descriptors, and how many of 5 new HTTP connections, 5 gRPC calls and 5 loads of a model
(isolated: a process of its own) then succeed.

    .venv/bin/python scripts/probe_breaks.py shm-regions --count 20000

``journal``: with ``--workers 2``, ``--count`` unloads of models never loaded, each named ``--mib`` MiB
(gRPC: the HTTP path would refuse the name); reports the workers journal's size, and how long a later
change (a load, a log setting) and a health check take.

    .venv/bin/python scripts/probe_breaks.py journal --count 62 --mib 1
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import time
from multiprocessing import shared_memory
from pathlib import Path

import tritonclient.grpc as grpcclient
from bench_hostile import ECHO_CONFIG, ECHO_MODEL, _free_port  # scripts/ is on sys.path
from probe_degraded import _request, arguments, run

SEQUENCE_CONFIG = """backend: "python"
max_batch_size: 0
sequence_batching { max_sequence_idle_microseconds: 1000000 }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
ISOLATED = 'parameters [ { key: "TRITON_ACTOR_ISOLATION" value: { string_value: "process" } } ]\n'


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the workers of ``--workers``, isolated models' processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                todo += [int(c) for c in Path(task).read_text().split()]
            except OSError:
                pass
    return out


def _resources(pid: int) -> dict:
    rss = fds = 0
    for p in _tree(pid):
        try:
            rss += next(int(line.split()[1]) for line in Path(f"/proc/{p}/status").read_text().splitlines()
                        if line.startswith("VmRSS:"))
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, StopIteration):
            pass
    return {"rss_mb": rss // 1024, "descriptors": fds}


def _infer_body(sequence: int, start: bool, end: bool) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                       "parameters": {"sequence_id": sequence, "sequence_start": start, "sequence_end": end}}).encode()


def _send_and_leave(port: int, path: str, body: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(body), body))


def sequences(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    path = "/v2/models/seq/infer"
    before = _resources(server.pid)
    _send_and_leave(port, path, _infer_body(1, True, False))
    for sequence in range(2, args.count + 2):
        _send_and_leave(port, path, _infer_body(sequence, True, False))
    started = time.monotonic()
    try:
        status, _ = _request(port, "POST", path, _infer_body(10**6, True, True), timeout=60)
    except OSError as e:
        status = f"no answer in 60 s ({e.__class__.__name__})"
    return {"abandoned_starts": args.count + 1, "fresh_sequence_status": status,
            "fresh_sequence_waited_s": round(time.monotonic() - started, 2),
            "before": before, "after": _resources(server.pid)}


def _grpc_ok(url: str) -> bool:
    try:
        client = grpcclient.InferenceServerClient(url)
        ok = client.is_server_live()
        client.close()
        return bool(ok)
    except Exception:  # noqa: BLE001 - counted as a failure, whatever it was
        return False


def shm_regions(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    objects: list[shared_memory.SharedMemory] = []  # one POSIX object a region: a key is registered once
    try:
        before = _resources(server.pid)
        registered, refusal, started = 0, None, time.monotonic()
        while registered < args.count:
            region = shared_memory.SharedMemory(create=True, size=64)
            region.close()  # the probe keeps the name only, not a descriptor
            objects.append(region)
            body = json.dumps({"key": "/" + region.name.lstrip("/"), "offset": 0, "byte_size": 64}).encode()
            try:
                status, answer = _request(port, "POST", f"/v2/systemsharedmemory/region/r{registered}/register", body)
            except OSError as e:
                refusal = f"connection failed: {e}"
                break
            if status != 200:
                refusal = f"{status} {answer[:200].decode('utf-8', 'replace')}"
                break
            registered += 1
        took = time.monotonic() - started
        during = _resources(server.pid)
        http_ok = sum(_health(port) for _ in range(5))
        grpc_ok = sum(_grpc_ok(f"127.0.0.1:{args.grpc_port}") for _ in range(5))
        loads = []
        for _ in range(5):
            status, answer = _request(port, "POST", "/v2/repository/models/isolated/load", b"{}")
            loads.append(status)
            _request(port, "POST", "/v2/repository/models/isolated/unload", b"{}")
        return {"registered": registered, "took_s": round(took, 2), "refusal": refusal, "before": before,
                "with_regions": during, "http_ok_of_5": http_ok, "grpc_ok_of_5": grpc_ok,
                "isolated_loads": loads}
    finally:
        for region in objects:
            region.unlink()


def _health(port: int) -> bool:
    try:
        return _request(port, "GET", "/v2/health/ready", timeout=10)[0] == 200
    except OSError:
        return False


def _run_dirs(pid: int) -> set[str]:
    """The workers' run directory: where the server's workers have their control sockets (``<run
    dir>/workers/<pid>.sock``, listed in /proc/net/unix)."""
    pids = {str(p) for p in _tree(pid)}
    found = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        path = line.split()[-1]
        folder, name = os.path.split(path)
        if name.endswith(".sock") and name[:-5] in pids and os.path.basename(folder) == "workers":
            found.add(os.path.dirname(folder))
    return found


def journal(port: int, server: subprocess.Popen, args: argparse.Namespace) -> dict:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{args.grpc_port}")
    unloads = []
    started = time.monotonic()
    for i in range(args.count):
        name = f"{i:04d}" + "n" * int(args.mib * 2**20)
        t0 = time.monotonic()
        try:
            client.unload_model(name)
            unloads.append(round(time.monotonic() - t0, 3))
        except Exception as e:  # noqa: BLE001 - reported
            unloads.append(str(e)[:80])
    took = time.monotonic() - started
    journals = [os.path.join(run_dir, "journal.json") for run_dir in _run_dirs(server.pid)]
    t0 = time.monotonic()
    load = _request(port, "POST", "/v2/repository/models/plain/load", b"{}")[0]
    load_s = time.monotonic() - t0
    t0 = time.monotonic()
    logging = _request(port, "POST", "/v2/logging", json.dumps({"log_verbose_level": 0}).encode())[0]
    logging_s = time.monotonic() - t0
    t0 = time.monotonic()
    health = _health(port)
    client.close()
    return {"unloads": len(unloads), "unloads_took_s": round(took, 2), "slowest_unload_s": max(
                (u for u in unloads if isinstance(u, float)), default=None),
            "journal_bytes": [os.path.getsize(p) for p in journals if os.path.exists(p)], "later_load": [load, round(load_s, 3)],
            "later_log_setting": [logging, round(logging_s, 3)],
            "health_after": [health, round(time.monotonic() - t0, 3)], "resources": _resources(server.pid)}


PROBES = {"sequences": sequences, "shm-regions": shm_regions, "journal": journal}


def main() -> None:
    args = arguments(__doc__, PROBES, (300, "abandoned starts / regions / unloads"),
                     (1.0, "journal: MiB of each unloaded model's name"))
    args.grpc_port = _free_port()
    plain = ECHO_CONFIG.replace('name: "echo"', "")
    models = {"plain": (plain, ECHO_MODEL), "seq": (SEQUENCE_CONFIG, ECHO_MODEL), "isolated": (plain + ISOLATED, ECHO_MODEL)}
    flags = {"sequences": ["--load-model", "seq"],
             "shm-regions": ["--allow-client-shm=true"],
             "journal": ["--workers", "2", "--load-model", "seq"]}[args.probe]
    run(PROBES[args.probe], models, ["--model-control-mode", "explicit", "--grpc-port", str(args.grpc_port), *flags], args)

if __name__ == "__main__":
    main()

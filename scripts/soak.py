#!/usr/bin/env python3
"""Soak test: mixed traffic at a fixed concurrency for a long time, watching the server for leaks.

Starts the server itself on a small generated repository in EXPLICIT mode (``--load-model '*'``), or
drives one given with ``--url`` (it must serve that repository: ``--write-repo DIR`` writes it). The
``--concurrency`` workers (default 64) are greenlets of this process, each with its own client, split
over HTTP infer (binary and JSON tensors), gRPC unary infer, gRPC streams of a decoupled model, infer
on a model that is unloaded and loaded again every ``--churn-secs`` by one more worker (its "not found"
/ "unavailable" answers while it is away are expected, counted apart), and statistics and /metrics
scrapes. Every answer is checked. Every ``--sample-secs`` it samples the server's RSS, open descriptors
(/proc/PID/fd) and threads and prints a progress line; at the end a summary.

    .venv/bin/python scripts/soak.py --duration 1800 --concurrency 64

Exit status 1 when any request failed unexpectedly, the server did not exit with 0 on SIGTERM, RSS
grew by 5 % or more from the first sample after ``--warmup-secs`` to the last, or descriptors or
threads at the end exceed the most they were in the first quarter of the measured period.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # before grpc is imported (tests/conftest.py)

from gevent import monkey

monkey.patch_all(subprocess=False, os=False, signal=False)

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gevent.queue  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from bench_http import ROOT, free_port, wait_ready  # noqa: E402  (scripts/ is on sys.path: run as a script)
from grpc.experimental import gevent as grpc_gevent  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

grpc_gevent.init_gevent()

CHURN = "churn"
CHURN_CONFIG = """
name: "churn"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
CHURN_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""
# what a request to the churn model may get while it is unloaded or unloading (Triton's texts)
EXPECTED_AWAY = re.compile(r"unknown model|no available versions|is unloading|is not ready|not found|unavailable", re.I)


def write_repo(repo: Path) -> Path:
    """The example models the soak needs (add_sub, identity_batch, text_generator) plus the churn model."""
    for name in ("add_sub", "identity_batch", "text_generator"):
        shutil.copytree(ROOT / "model_repository" / name, repo / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (repo / CHURN / "1").mkdir(parents=True, exist_ok=True)
    (repo / CHURN / "config.pbtxt").write_text(textwrap.dedent(CHURN_CONFIG))
    (repo / CHURN / "1" / "model.py").write_text(textwrap.dedent(CHURN_PY))
    return repo


# -- the server ---------------------------------------------------------------------------------------
@dataclass
class Target:
    http: str
    grpc: str
    metrics: str
    pid: int | None
    proc: subprocess.Popen | None = None


def start_server(repo: Path, log: Path, extra: list[str]) -> Target:
    ports = [free_port() for _ in range(3)]
    args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repo),
            "--http-address", "127.0.0.1", "--http-port", str(ports[0]),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(ports[1]),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(ports[2]),
            "--model-control-mode", "explicit", "--load-model", "*", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_ready(ports[0], proc, timeout=120)
    except SystemExit:
        proc.kill()
        print(log.read_text(), file=sys.stderr)
        raise
    return Target(f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}/metrics",
                  proc.pid, proc)


def stop_server(target: Target) -> int | None:
    """SIGTERM the server we started; its exit status (None if we did not start it)."""
    if target.proc is None:
        return None
    target.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 90
    while target.proc.poll() is None and time.monotonic() < deadline:
        gevent.sleep(0.1)
    if target.proc.poll() is None:
        target.proc.kill()
    return target.proc.wait()


@dataclass(frozen=True)
class Sample:
    t: float
    rss_kib: int
    fds: int
    threads: int


def sample(pid: int, t: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return Sample(t, rss, len(os.listdir(f"/proc/{pid}/fd")), threads)


# -- traffic ------------------------------------------------------------------------------------------
@dataclass
class Tally:
    ok: collections.Counter = field(default_factory=collections.Counter)
    expected: collections.Counter = field(default_factory=collections.Counter)
    unexpected: collections.Counter = field(default_factory=collections.Counter)
    away: collections.Counter = field(default_factory=collections.Counter)  # texts of the expected errors
    examples: list[str] = field(default_factory=list)

    def error(self, kind: str, e: BaseException) -> None:
        self.unexpected[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {type(e).__name__}: {str(e)[:300]}")


class Mismatch(Exception):
    """An answer arrived but was wrong."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise Mismatch(what)


def _add_sub_inputs(mod: Any, binary: bool | None) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    inputs = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
    for i, x in zip(inputs, (a, b), strict=True):
        if binary is None:
            i.set_data_from_numpy(x)
        else:
            i.set_data_from_numpy(x, binary_data=binary)
    return inputs, a, b


class Http:
    def __init__(self, target: Target, binary: bool) -> None:
        self.c = httpclient.InferenceServerClient(target.http, connection_timeout=60, network_timeout=60)
        self.binary = binary

    def __call__(self) -> None:
        inputs, a, b = _add_sub_inputs(httpclient, self.binary)
        outs = [httpclient.InferRequestedOutput(n, binary_data=self.binary) for n in ("OUTPUT0", "OUTPUT1")]
        r = self.c.infer("add_sub", inputs, outputs=outs)
        _check(np.allclose(r.as_numpy("OUTPUT0"), a + b) and np.allclose(r.as_numpy("OUTPUT1"), a - b), "add_sub")

    def close(self) -> None:
        self.c.close()


class GrpcUnary:
    def __init__(self, target: Target) -> None:
        self.c = grpcclient.InferenceServerClient(target.grpc)
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        if self.n % 2:
            inputs, a, b = _add_sub_inputs(grpcclient, None)
            r = self.c.infer("add_sub", inputs, client_timeout=60)
            _check(np.allclose(r.as_numpy("OUTPUT0"), a + b), "add_sub over gRPC")
            return
        x = np.random.rand(1, 3).astype(np.float32)
        i = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        i.set_data_from_numpy(x)
        _check(np.array_equal(self.c.infer("identity_batch", [i], client_timeout=60).as_numpy("OUTPUT0"), x),
               "identity_batch")

    def close(self) -> None:
        self.c.close()


class GrpcStream:
    """One stream kept open; each call asks text_generator for 1-6 tokens and waits for all and the final flag."""

    def __init__(self, target: Target) -> None:
        self.c = grpcclient.InferenceServerClient(target.grpc)
        self.q: gevent.queue.Queue = gevent.queue.Queue()
        self.c.start_stream(callback=lambda result, error: self.q.put((result, error)))
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        tokens = random.randint(1, 6)
        prompt = grpcclient.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"soak"], dtype=np.object_))
        limit = grpcclient.InferInput("max_tokens", [1], "INT32")
        limit.set_data_from_numpy(np.array([tokens], dtype=np.int32))
        rid = f"s{self.n}"
        self.c.async_stream_infer("text_generator", [prompt, limit], request_id=rid, enable_empty_final_response=True)
        got = 0
        while True:
            result, error = self.q.get(timeout=60)
            if error is not None:
                raise error
            response = result.get_response()
            _check(response.id == rid, f"stream answer for {response.id}, expected {rid}")
            if response.parameters["triton_final_response"].bool_param:
                break
            _check(int(result.as_numpy("index")[0]) == got, "token index")
            got += 1
        _check(got == tokens, f"{got} tokens of {tokens}")

    def close(self) -> None:
        self.c.stop_stream()
        self.c.close()


class Churned:
    """Infer on the model that comes and goes, alternately over HTTP and gRPC: errors naming it are expected."""

    def __init__(self, target: Target) -> None:
        self.h = httpclient.InferenceServerClient(target.http, connection_timeout=60, network_timeout=60)
        self.g = grpcclient.InferenceServerClient(target.grpc)
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        mod, client = (httpclient, self.h) if self.n % 2 else (grpcclient, self.g)
        x = np.random.rand(3).astype(np.float32)
        i = mod.InferInput("INPUT0", [3], "FP32")
        i.set_data_from_numpy(x)
        _check(np.array_equal(client.infer(CHURN, [i]).as_numpy("OUTPUT0"), x), "churn")

    def close(self) -> None:
        self.h.close()
        self.g.close()


class Scrape:
    """Statistics over HTTP and gRPC, and the Prometheus endpoint, in turn."""

    def __init__(self, target: Target) -> None:
        self.h = httpclient.InferenceServerClient(target.http, connection_timeout=60, network_timeout=60)
        self.g = grpcclient.InferenceServerClient(target.grpc)
        self.metrics = target.metrics
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        if self.n % 3 == 0:
            with urllib.request.urlopen(self.metrics, timeout=60) as r:
                _check(b"nv_inference_request_success" in r.read(), "metrics")
        elif self.n % 3 == 1:
            stats = self.h.get_inference_statistics("add_sub")["model_stats"]
            _check(bool(stats), "statistics over HTTP")
        else:
            _check(bool(self.g.get_inference_statistics("", as_json=True)["model_stats"]), "statistics over gRPC")
        gevent.sleep(0.05)  # a scraper, not a load generator

    def close(self) -> None:
        self.h.close()
        self.g.close()


class Lifecycle:
    """Unloads the churn model and loads it again (HTTP and gRPC in turn); every other cycle a reload in place."""

    def __init__(self, target: Target, period: float) -> None:
        self.h = httpclient.InferenceServerClient(target.http, connection_timeout=120, network_timeout=120)
        self.g = grpcclient.InferenceServerClient(target.grpc)
        self.period = period
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        client = self.h if self.n % 2 else self.g
        if self.n % 4 == 0:
            client.load_model(CHURN)  # reload while serving: load-then-swap, no request may fail
        else:
            client.unload_model(CHURN)
            gevent.sleep(self.period / 4)  # the model is away: requests to it get Triton's errors
            client.load_model(CHURN)
        _check(self.h.is_model_ready(CHURN), "churn ready after load")
        gevent.sleep(self.period)

    def close(self) -> None:
        self.h.close()
        self.g.close()


def plan(concurrency: int) -> list[str]:
    """How the workers are split: one lifecycle worker, at least one of each other kind, the rest by weight."""
    weights = {"http_binary": 0.25, "http_json": 0.15, "grpc_unary": 0.30, "grpc_stream": 0.15,
               "churn_infer": 0.07, "scrape": 0.08}
    kinds = ["lifecycle", *weights]
    rest = max(0, concurrency - len(kinds))
    for kind, w in weights.items():
        kinds += [kind] * int(w * rest)
    kinds += ["http_binary"] * (concurrency - len(kinds))
    return kinds[:max(concurrency, len(weights) + 1)]


def make(kind: str, target: Target, churn_secs: float) -> Any:
    return {
        "http_binary": lambda: Http(target, True), "http_json": lambda: Http(target, False),
        "grpc_unary": lambda: GrpcUnary(target), "grpc_stream": lambda: GrpcStream(target),
        "churn_infer": lambda: Churned(target), "scrape": lambda: Scrape(target),
        "lifecycle": lambda: Lifecycle(target, churn_secs),
    }[kind]()


def work(kind: str, op: Callable[[], None], stop: gevent.event.Event, tally: Tally) -> None:
    while not stop.is_set():
        try:
            op()
        except Exception as e:  # noqa: BLE001 - every failure is classified and counted
            if kind == "churn_infer" and isinstance(e, InferenceServerException) and EXPECTED_AWAY.search(str(e)):
                tally.expected[kind] += 1
                tally.away[re.sub(r"\d+", "N", str(e))[:120]] += 1
                gevent.sleep(0.01)  # the model is away: do not spin on the error
            else:
                tally.error(kind, e)
                gevent.sleep(0.1)
        else:
            tally.ok[kind] += 1


# -- run ----------------------------------------------------------------------------------------------
def run(target: Target, args: argparse.Namespace) -> int:
    tally = Tally()
    stop = gevent.event.Event()
    kinds = plan(args.concurrency)
    ops = [(k, make(k, target, args.churn_secs)) for k in kinds]
    print(f"[soak] {len(ops)} workers: {dict(collections.Counter(kinds))}; {args.duration:.0f} s, "
          f"warm-up {args.warmup_secs:.0f} s, server pid {target.pid}", flush=True)
    workers = [gevent.spawn(work, k, op, stop, tally) for k, op in ops]
    samples: list[Sample] = []
    start = time.monotonic()
    last_total = 0
    while (elapsed := time.monotonic() - start) < args.duration:
        gevent.sleep(min(args.sample_secs, max(0.0, args.duration - elapsed)))
        elapsed = time.monotonic() - start
        total = sum(tally.ok.values()) + sum(tally.expected.values())
        line = f"[soak {elapsed:6.0f}s] requests {total} ({(total - last_total) / args.sample_secs:.0f}/s)"
        last_total = total
        if target.pid is not None:
            s = sample(target.pid, elapsed)
            samples.append(s)
            line += f" rss {s.rss_kib / 1024:.1f} MiB fds {s.fds} threads {s.threads}"
        print(f"{line} unexpected {sum(tally.unexpected.values())} expected {sum(tally.expected.values())}",
              flush=True)
        if target.proc is not None and target.proc.poll() is not None:
            tally.error("server", RuntimeError(f"server exited with {target.proc.returncode}"))
            break
    stop.set()
    gevent.joinall(workers, timeout=120)
    stuck = sum(not w.dead for w in workers)
    if stuck:
        tally.error("workers", RuntimeError(f"{stuck} workers still waiting 120 s after the end"))
    if target.pid is not None and target.proc is not None and target.proc.poll() is None:
        samples.append(sample(target.pid, time.monotonic() - start))  # quiet, every client still connected
    for _, op in ops:
        op.close()
    code = stop_server(target)
    if code not in (None, 0):
        tally.error("server", RuntimeError(f"exit status {code} after SIGTERM"))
    return summary(tally, samples, args, code)


def summary(tally: Tally, samples: list[Sample], args: argparse.Namespace, code: int | None) -> int:
    unexpected = sum(tally.unexpected.values())
    by_kind = {k: tally.ok[k] for k in sorted(tally.ok)}
    print(f"[soak] requests ok by kind: {json.dumps(by_kind)}")
    print(f"[soak] expected errors (churn model away): {sum(tally.expected.values())}; "
          f"unexpected errors: {unexpected} {dict(tally.unexpected)}")
    for text, n in tally.away.most_common(5):
        print(f"[soak]   expected x{n}: {text}")
    for example in tally.examples:
        print(f"[soak]   {example}")
    failed = unexpected > 0
    measured = [s for s in samples if s.t >= args.warmup_secs]
    if len(measured) >= 2:
        first, last = measured[0], measured[-1]
        growth = 100.0 * (last.rss_kib - first.rss_kib) / first.rss_kib
        head = measured[:max(3, len(measured) // 4)]  # the churn model's thread comes and goes: a window
        fds_grew = last.fds > max(s.fds for s in head)
        threads_grew = last.threads > max(s.threads for s in head)
        print(f"[soak] rss after warm-up {first.rss_kib / 1024:.1f} MiB (t={first.t:.0f}s) -> last "
              f"{last.rss_kib / 1024:.1f} MiB: growth {growth:+.2f} %")
        print(f"[soak] fds min {min(s.fds for s in measured)} max {max(s.fds for s in measured)} last {last.fds}"
              f"{' GREW' if fds_grew else ''}; threads min {min(s.threads for s in measured)} "
              f"max {max(s.threads for s in measured)} last {last.threads}{' GREW' if threads_grew else ''}")
        failed |= growth >= 5.0 or fds_grew or threads_grew
    elif samples:
        print("[soak] too short for a growth figure (fewer than two samples after the warm-up)")
    if code is not None:
        print(f"[soak] server exit status after SIGTERM: {code}")
    print(f"[soak] {'FAIL' if failed else 'PASS'}", flush=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (default 30 min)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sample-secs", type=float, default=10.0)
    ap.add_argument("--warmup-secs", type=float, default=None,
                    help="growth is measured from the first sample after this (default: a tenth of the duration, at most 120)")
    ap.add_argument("--churn-secs", type=float, default=4.0, help="period of the churn model's unload/load")
    ap.add_argument("--url", help="HTTP host:port of a running server (it must serve --write-repo's models, EXPLICIT mode)")
    ap.add_argument("--grpc-url", help="with --url: its gRPC host:port")
    ap.add_argument("--metrics-url", help="with --url: its /metrics URL")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id, for RSS/fds/threads")
    ap.add_argument("--write-repo", type=Path, help="write the soak's model repository here and exit")
    ap.add_argument("--server-arg", action="append", default=[], help="extra flag for the server we start")
    args = ap.parse_args()
    if args.warmup_secs is None:
        args.warmup_secs = min(120.0, args.duration / 10)
    if args.write_repo:
        write_repo(args.write_repo)
        return 0
    if args.url:
        if not (args.grpc_url and args.metrics_url):
            ap.error("--url needs --grpc-url and --metrics-url")
        return run(Target(args.url, args.grpc_url, args.metrics_url, args.pid), args)
    with tempfile.TemporaryDirectory(prefix="soak-") as work:
        repo = write_repo(Path(work) / "repo")
        log = Path(work) / "server.log"
        target = start_server(repo, log, args.server_arg)
        try:
            return run(target, args)
        finally:
            if target.proc is not None and target.proc.poll() is None:
                target.proc.kill()
            errors = [line for line in log.read_text().splitlines() if line.startswith(("E", "Traceback"))]
            print(f"[soak] server log: {len(errors)} error lines" + "".join(f"\n  {e}" for e in errors[:10]))


if __name__ == "__main__":
    sys.exit(main())

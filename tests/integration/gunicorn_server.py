"""A real gunicorn arbiter with our worker class (``gunicorn -c conf/gunicorn.conf.py``) on free ports."""

from __future__ import annotations

import os
import re
import shlex
import sys

import gevent
import gevent.pool
import numpy as np
import tritonclient.http as httpclient

from .server import LOOPBACK_PORTS, ChildServer

_LISTENING = re.compile(r"Listening at: http://[^:]+:(\d+),http://[^:]+:(\d+)(?:,http://[^:]+:(\d+))?")
_BOOTED = re.compile(r"Booting worker with pid: (\d+)")
_SERVING = re.compile(r"worker \d+ \(pid (\d+)\) is serving")

# OUTPUT0 = the serving worker's pid: which process answered is visible to the client
PID_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], np.int64))])
                for _ in requests]
"""
PID_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT64, dims: [ 1 ] } ]
"""


class Gunicorn(ChildServer):
    """gunicorn with ``workers`` TritonWorkers; ``flags`` are the triton-actor flags of every worker."""

    port = grpc_port = metrics_port = 0

    def __init__(self, *flags: str, workers: int = 2, open_files: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        args = [*LOOPBACK_PORTS, "--exit-timeout-secs", "20", *flags]
        self.serving: list[int] = []  # worker pids, in the order they started serving
        super().__init__([sys.executable, "-m", "gunicorn", "-c", "conf/gunicorn.conf.py"],
                         {"TRITON_ACTOR_ARGS": shlex.join(args), "TRITON_ACTOR_WORKERS": str(workers), **(env or {})},
                         open_files)

    def _on_line(self, line: str) -> None:
        m = _LISTENING.search(line)
        if m:
            self.port, self.grpc_port = int(m.group(1)), int(m.group(2))
            self.metrics_port = int(m.group(3) or 0)
        m = _SERVING.search(line)
        if m:
            self.serving.append(int(m.group(1)))

    def log(self) -> str:
        return self.stderr.text(last=200)

    def wait_serving(self, count: int, timeout: float = 90) -> list[int]:
        """Wait until ``count`` workers (in all, since start) logged that they serve; their pids."""
        if not self.stderr.wait(lambda: len(self.serving) >= count, timeout):
            gone = self.stderr.ended or self.proc.poll() is not None
            exited = "gunicorn exited" if gone else f"{count} workers never served"
            raise AssertionError(f"{exited}:\n{self.log()}")
        return self.serving[:count]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


def pid_infer(url: str, model: str = "pid") -> int:
    """One inference on a fresh connection (so the kernel may give it to any worker): the worker's pid."""
    client = httpclient.InferenceServerClient(url, concurrency=1)
    try:
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, np.float32))
        return int(client.infer(model, [inp]).as_numpy("OUTPUT0")[0])
    finally:
        client.close()


def pids_seen(url: str, want: set[int], model: str = "pid", tries: int = 200) -> set[int]:
    """Infer on fresh connections until every pid in ``want`` answered (or ``tries`` ran out), eight at
    a time: one connection after another can all go to the worker that just answered (it is awake
    first, and on a loaded machine it kept winning 200 times), eight at once also reach the others."""
    seen: set[int] = set()
    for _ in range(0, tries, 8):
        seen.update(gevent.pool.Pool(8).map(lambda _: pid_infer(url, model), range(8)))
        if want <= seen:
            break
    return seen


def wait_gone(pids: set[int], timeout: float = 60) -> None:
    """Wait until the processes ``pids`` (old workers, reaped by the arbiter) no longer exist."""
    with gevent.Timeout(timeout, AssertionError(f"workers {pids} never exited")):
        while True:
            alive = set()
            for pid in pids:
                try:
                    os.kill(pid, 0)
                    alive.add(pid)
                except ProcessLookupError:
                    pass
            if not alive:
                return
            gevent.sleep(0.05)  # another process's exit: nothing here to wait on but its pid

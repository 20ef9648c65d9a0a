"""Start the real server in a subprocess on port 0 and read the bound port back from its log."""

from __future__ import annotations

import os
import re
import resource
import select
import signal
import sys
import textwrap
from pathlib import Path

from gevent import subprocess  # cooperative pipes: the harness reads server logs in a greenlet

from .server_log import ServerLog

ROOT = Path(__file__).resolve().parents[2]
_PORTS = {"port": re.compile(r"Started HTTPService at [^ ]+:(\d+)"),
          "grpc_port": re.compile(r"Started GRPCInferenceService at [^ ]+:(\d+)"),
          "metrics_port": re.compile(r"Started Metrics Service at [^ ]+:(\d+)")}


# every port on loopback, chosen by the kernel: the harness reads the bound ports back from the log
LOOPBACK_PORTS = ("--http-port", "0", "--http-address", "127.0.0.1", "--grpc-port", "0", "--grpc-address", "127.0.0.1",
                  "--metrics-port", "0", "--metrics-address", "127.0.0.1")


class ChildServer:
    """A server process the harness starts: one server (:class:`ServerProcess`) or gunicorn's arbiter
    (``gunicorn_server.Gunicorn``). Its stderr is collected (:class:`ServerLog`, each line to
    :meth:`_on_line`); ``open_files``: its RLIMIT_NOFILE (soft and hard), to reach its descriptor limit cheaply."""

    port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None

    def __init__(self, args: list[str], env: dict[str, str] | None = None, open_files: int | None = None) -> None:
        limit = None if open_files is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files,) * 2))
        self.proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), preexec_fn=limit)
        self.stderr = ServerLog(self.proc, self._on_line)

    def _on_line(self, line: str) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def wait_exit(self, timeout: float = 60) -> int:
        self.stderr.join(timeout)
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.wait_exit(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class ServerProcess(ChildServer):
    """``python -m triton_actor`` with the given repositories and flags."""

    def __init__(self, *repos: Path, flags: tuple[str, ...] = (), open_files: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        args = [sys.executable, "-m", "triton_actor"]
        for repo in repos:
            args += ["--model-repository", str(repo)]
        self.ready = False
        super().__init__([*args, *LOOPBACK_PORTS, *flags], env=env, open_files=open_files)

    def _on_line(self, line: str) -> None:
        for attr, pattern in _PORTS.items():
            m = pattern.search(line)
            if m:
                setattr(self, attr, int(m.group(1)))
        if "server is ready" in line:
            self.ready = True

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def wait_ready(self, timeout: float = 60) -> ServerProcess:
        """Wait until the server logged that startup finished; raise with its log if it exited."""
        if not self.stderr.wait(lambda: self.ready, timeout) or self.proc.poll() is not None or self.port is None:
            raise RuntimeError("server did not start:\n" + self.log())
        return self

    def log(self) -> str:
        return self.stderr.text()


def wait_for_fifo(fifo: Path, server: ServerProcess, timeout: float = 60) -> None:
    """Wait (on the fd, no sleep) until a model writes to ``fifo`` (made with ``os.mkfifo``)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, "the request never reached execute():\n" + server.log()
    finally:
        os.close(fd)


def add_model(repo: Path, name: str, config: str | None, model_py: str, versions: tuple[str, ...] = ("1",),
              files: dict[str, str] | None = None) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and ``<version>/model.py`` (+ extra files relative to the model dir)."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    for v in versions:
        (model_dir / v).mkdir(exist_ok=True)
        (model_dir / v / "model.py").write_text(textwrap.dedent(model_py))
    for rel, text in (files or {}).items():
        path = model_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return model_dir


IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""

IDENTITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


GATED_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""

GATED_PY = """
import os
import time
import triton_python_backend_utils as pb_utils

LOG, GATE = {log!r}, {gate!r}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            with open(LOG, "a") as f:
                f.write(f"{{x.flat[0]}}\\n")
            deadline = time.monotonic() + {hold_s}  # bounded: a test that fails never opens the gate
            while x.flat[0] == 1.0 and not os.path.exists(GATE) and time.monotonic() < deadline:
                time.sleep(0.01)  # model code polling the test's gate file
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def gated_model_py(log: Path, gate: Path, hold_s: float = 60) -> str:
    """An identity ``model.py`` that logs the first value of each request it runs and holds a request
    whose first value is 1 until the file ``gate`` exists (at most ``hold_s``): tests see what ran, and when."""
    return GATED_PY.format(log=str(log), gate=str(gate), hold_s=hold_s)


def add_gated_model(repo: Path, name: str, log: Path, gate: Path, dims: str = "1", count: int = 1) -> Path:
    """:func:`gated_model_py` with a config of FP32 ``dims`` in and out and ``count`` instances."""
    return add_model(repo, name, GATED_CONFIG.format(name=name, dims=dims, count=count), gated_model_py(log, gate))

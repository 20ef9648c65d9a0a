"""The server under test: one started here (``python -m triton_actor``, EXPLICIT mode, ports chosen by the
kernel) or one attached to with ``--url``. Spoken to only through the official ``tritonclient``, over
the protocol the user picked, as any client would: model config, load with a ``config`` override,
statistics.

Runs in the tuner's main thread. A refused load raises ``TritonError`` with the server's message (the
caller records it as a failed point); so does a server that does not start, with its log's tail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import TritonError

_PORTS = {"http": re.compile(r"Started HTTPService at [^ ]+:(\d+)"),
          "grpc": re.compile(r"Started GRPCInferenceService at [^ ]+:(\d+)")}
# with --workers the arbiter binds the ports (HTTP first, then gRPC) and each worker says when it serves
_LISTENING = re.compile(r"Listening at: http://[^:]+:(\d+),http://[^:]+:(\d+)")
_SERVING = re.compile(r"worker \d+ \(pid \d+\) is serving")
START_TIMEOUT_S = 120.0


class Target:
    """A server and a control client on it. ``proc`` is set when this process started the server."""

    def __init__(self, url: str, protocol: str, model: str, proc: subprocess.Popen[bytes] | None = None,
                 log_path: Path | None = None, http_url: str | None = None) -> None:
        self.url, self.protocol, self.model, self.proc, self.log_path = url, protocol, model, proc, log_path
        self.http_url = http_url or (url if protocol == "http" else None)  # for what only HTTP has (the report link)
        self.workers = 1  # --workers of a server started here
        self._start: tuple[Path, tuple[str, ...]] | None = None  # its repository and flags, for a restart
        self._connect()

    def _connect(self) -> None:
        if self.protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self._module = module
        self.client = module.InferenceServerClient(self.url)

    @classmethod
    def start(cls, repository: Path, model: str, protocol: str, log_path: Path, flags: tuple[str, ...] = (),
              workers: int = 1) -> Target:
        """Start our server on ``repository`` with only ``model`` loaded; wait until it is ready."""
        proc, ports = _launch(repository, model, log_path, flags, workers)
        target = cls(f"127.0.0.1:{ports[protocol]}", protocol, model, proc, log_path, f"127.0.0.1:{ports['http']}")
        target.workers, target._start = workers, (repository, flags)
        return target

    @property
    def restartable(self) -> bool:
        return self._start is not None

    def restart(self, workers: int) -> None:
        """Stop the server started here and start it again with ``--workers`` ``workers`` (each model
        then serves its repository config until the next load): the one setting the load API cannot change."""
        if self._start is None or self.log_path is None:
            raise TritonError.unavailable("only a server started by tune can be restarted")
        self.close()
        repository, flags = self._start
        self.proc, ports = _launch(repository, self.model, self.log_path, flags, workers, append=True)
        self.url, self.http_url = f"127.0.0.1:{ports[self.protocol]}", f"127.0.0.1:{ports['http']}"
        self.workers = workers
        self._connect()

    @classmethod
    def attach(cls, url: str, protocol: str, model: str) -> Target:
        target = cls(url.split("://", 1)[-1].rstrip("/"), protocol, model)  # tritonclient takes host:port
        if not target.call("is_model_ready", model):
            raise TritonError.unavailable(f"model '{model}' is not ready on {url}")
        return target

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A client call; the client's exception becomes ``TritonError`` with the server's message."""
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except self._module.InferenceServerException as e:
            raise TritonError.unavailable(e.message() or str(e)) from None

    def config_json(self) -> dict[str, Any]:
        """The model's config as the server serves it (gRPC's JSON prints 64-bit integers as strings)."""
        if self.protocol == "grpc":
            return self.call("get_model_config", self.model, as_json=True)["config"]
        return self.call("get_model_config", self.model)

    def config_of(self, model: str) -> dict[str, Any]:
        """Another model's served config (an ensemble's composing model)."""
        if self.protocol == "grpc":
            return self.call("get_model_config", model, as_json=True)["config"]
        return self.call("get_model_config", model)

    def load(self, config_json: str | None, model: str = "") -> None:
        """Load the model (or ``model``) with this config (load-then-swap: what serves keeps serving until it is ready)."""
        self.call("load_model", model or self.model, config=config_json)

    def statistics(self, model: str = "") -> dict[str, float]:
        """Totals over the versions of the model (or ``model``): successes, executions, queue and compute
        (infer) nanoseconds."""
        kwargs = {"as_json": True} if self.protocol == "grpc" else {}
        stats = self.call("get_inference_statistics", model or self.model, **kwargs)
        out = {"count": 0.0, "executions": 0.0, "queue_ns": 0.0, "compute_ns": 0.0}
        for version in stats.get("model_stats", []):
            infer = version.get("inference_stats", {})
            out["count"] += float(infer.get("success", {}).get("count", 0))
            out["executions"] += float(version.get("execution_count", 0))
            out["queue_ns"] += float(infer.get("queue", {}).get("ns", 0))
            out["compute_ns"] += float(infer.get("compute_infer", {}).get("ns", 0))
        return out

    def cpu_seconds(self) -> float | None:
        """The started server's CPU time with its descendants' (workers, process-isolated instances), user +
        system, from ``/proc``; None when attached or where there is no ``/proc``."""
        if self.proc is None or not Path("/proc/self/stat").is_file():
            return None
        stats = {int(e.name): st for e in Path("/proc").iterdir() if e.name.isdigit() and (st := _stat(e)) is not None}
        ours, grew = {self.proc.pid}, True
        while grew:  # a worker's process-isolated instances are the arbiter's grandchildren
            more = {pid for pid, st in stats.items() if int(st[1]) in ours} - ours
            ours |= more
            grew = bool(more)
        clock = os.sysconf("SC_CLK_TCK")
        return sum((int(stats[pid][11]) + int(stats[pid][12])) / clock for pid in ours if pid in stats)  # utime, stime

    def register_report(self, folder: Path) -> str:
        """Tell the server where this run's report is, so its status page links it (``/tune/report/``);
        what it answered, for the run's notes. Only over HTTP (the route is HTTP's)."""
        if self.http_url is None:
            return "the status page link needs the server's HTTP port: not registered over gRPC"
        import urllib.error
        import urllib.request

        body = json.dumps({"path": str(folder.resolve())}).encode()
        request = urllib.request.Request(f"http://{self.http_url}/v2/tune/report", body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30):
                return f"the server's status page links this report: http://{self.http_url}/tune/report/"
        except (urllib.error.URLError, OSError) as e:
            detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else str(e)
            return f"the server did not take the report's link: {detail}"

    def restore(self, original: dict[str, Any], model: str = "") -> None:
        """Serve the config the model (or ``model``) had before: reload from the repository, and when that
        is not the one it had (it was loaded with an override), load that one again as an override."""
        self.load(None, model)
        if self.config_of(model or self.model) != original:
            self.load(json.dumps(original), model)

    def close(self) -> None:
        self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stat(entry: Path) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state, ppid, ...); None for a process gone meanwhile."""
    try:
        return entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _launch(repository: Path, model: str, log_path: Path, flags: tuple[str, ...], workers: int,
            append: bool = False) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repository),
            "--model-control-mode", "explicit", "--load-model", model, "--http-port", "0",
            "--http-address", "127.0.0.1", "--grpc-port", "0", "--grpc-address", "127.0.0.1",
            "--metrics-port", "0", "--metrics-address", "127.0.0.1", *flags, *(("--workers", str(workers)) if workers > 1 else ())]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if append and log_path.exists() else 0
    with log_path.open("ab" if append else "wb") as log:  # a session of its own: Ctrl-C is the tuner's, which then stops it
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        return proc, _wait_ready(proc, log_path, workers, offset)
    except BaseException:  # Ctrl-C while it starts: it must not outlive us
        proc.kill()
        proc.wait()
        raise


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, workers: int = 1, offset: int = 0) -> dict[str, int]:
    """The ports the server logged once it logged that it is ready (with ``workers`` > 1: the arbiter's
    ports once every worker serves); its log is a file, read from ``offset``: nothing to drain."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        if workers > 1 and len(_SERVING.findall(text)) >= workers and (m := _LISTENING.search(text)):
            return {"http": int(m.group(1)), "grpc": int(m.group(2))}
        if workers <= 1 and "server is ready" in text:
            return {name: int(m.group(1)) for name, pattern in _PORTS.items() if (m := pattern.search(text))}
        if proc.poll() is not None:
            break
        time.sleep(0.05)  # the server writes its log as it starts; a file has no readiness event
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
    raise TritonError.unavailable(f"the server did not start (log: {log_path}):\n{tail}")

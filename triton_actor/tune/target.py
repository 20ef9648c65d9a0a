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
START_TIMEOUT_S = 120.0


class Target:
    """A server and a control client on it. ``proc`` is set when this process started the server."""

    def __init__(self, url: str, protocol: str, model: str, proc: subprocess.Popen[bytes] | None = None,
                 log_path: Path | None = None) -> None:
        self.url, self.protocol, self.model, self.proc, self.log_path = url, protocol, model, proc, log_path
        if protocol == "grpc":
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self._module = module
        self.client = module.InferenceServerClient(url)

    @classmethod
    def start(cls, repository: Path, model: str, protocol: str, log_path: Path, flags: tuple[str, ...] = ()) -> Target:
        """Start our server on ``repository`` with only ``model`` loaded; wait until it is ready."""
        args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repository),
                "--model-control-mode", "explicit", "--load-model", model, "--http-port", "0",
                "--http-address", "127.0.0.1", "--grpc-port", "0", "--grpc-address", "127.0.0.1",
                "--metrics-port", "0", "--metrics-address", "127.0.0.1", *flags]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:  # a session of its own: Ctrl-C is the tuner's, which then stops it
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            ports = _wait_ready(proc, log_path)
        except BaseException:  # Ctrl-C while it starts: it must not outlive us
            proc.kill()
            proc.wait()
            raise
        return cls(f"127.0.0.1:{ports[protocol]}", protocol, model, proc, log_path)

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

    def load(self, config_json: str | None) -> None:
        """Load the model with this config (load-then-swap: what serves keeps serving until it is ready)."""
        self.call("load_model", self.model, config=config_json)

    def statistics(self) -> dict[str, float]:
        """Totals over the model's versions: successes, executions, queue and compute (infer) nanoseconds."""
        kwargs = {"as_json": True} if self.protocol == "grpc" else {}
        stats = self.call("get_inference_statistics", self.model, **kwargs)
        out = {"count": 0.0, "executions": 0.0, "queue_ns": 0.0, "compute_ns": 0.0}
        for version in stats.get("model_stats", []):
            infer = version.get("inference_stats", {})
            out["count"] += float(infer.get("success", {}).get("count", 0))
            out["executions"] += float(version.get("execution_count", 0))
            out["queue_ns"] += float(infer.get("queue", {}).get("ns", 0))
            out["compute_ns"] += float(infer.get("compute_infer", {}).get("ns", 0))
        return out

    def cpu_seconds(self) -> float | None:
        """The started server's CPU time with its children's (process-isolated instances), user + system,
        from ``/proc``; None when attached or where there is no ``/proc``."""
        if self.proc is None or not Path("/proc/self/stat").is_file():
            return None
        total = 0.0
        for entry in Path("/proc").iterdir():
            stat = _stat(entry) if entry.name.isdigit() else None
            if stat is not None and (int(entry.name) == self.proc.pid or int(stat[1]) == self.proc.pid):
                total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (proc(5))
        return total

    def restore(self, original: dict[str, Any]) -> None:
        """Serve the config the model had before: reload from the repository, and when that is not the one
        it had (it was loaded with an override), load that one again as an override."""
        self.load(None)
        if self.config_json() != original:
            self.load(json.dumps(original))

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


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path) -> dict[str, int]:
    """The ports the server logged once it logged that it is ready (its log is a file: nothing to drain)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if "server is ready" in text:
            return {name: int(m.group(1)) for name, pattern in _PORTS.items() if (m := pattern.search(text))}
        if proc.poll() is not None:
            break
        time.sleep(0.05)  # the server writes its log as it starts; a file has no readiness event
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
    raise TritonError.unavailable(f"the server did not start (log: {log_path}):\n{tail}")

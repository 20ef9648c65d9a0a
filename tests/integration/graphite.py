"""A real StatsD daemon (npm ``statsd`` 0.9.0) flushing to a real Graphite carbon-cache, both in ``tmp_path``.

Installed by ``scripts/install_test_deps.sh`` (Debian's graphite-carbon and python3-whisper; npm statsd in
``~/.cache/triton_actor_test/npm``). Both daemons are started as subprocesses, waited on until they listen
(their ports answer), and stopped by pid. Stored points are read back with Debian's ``whisper-fetch``.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import gevent
from gevent import subprocess

STATSD_JS = Path(os.environ.get("TRITON_ACTOR_TEST_CACHE", Path.home() / ".cache/triton_actor_test")) \
    / "npm/node_modules/statsd/stats.js"
CARBON = Path("/usr/bin/carbon-cache")
WHISPER_FETCH = Path("/usr/bin/whisper-fetch")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port} within {timeout} s") from None
            gevent.sleep(0.05)  # polling for a port to open: there is no event to wait on


class Graphite:
    """carbon-cache (line receiver) + statsd (UDP) on free ports; ``fetch(metric)`` reads a whisper file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.storage = root / "storage"
        self.whisper_dir = self.storage / "whisper"
        self.whisper_dir.mkdir(parents=True)
        self.carbon_port, pickle_port, query_port = free_port(), free_port(), free_port()
        self.statsd_port, mgmt_port = free_port(socket.SOCK_DGRAM), free_port()
        (root / "carbon.conf").write_text(f"""[cache]
STORAGE_DIR = {self.storage}/
LOCAL_DATA_DIR = {self.whisper_dir}/
WHITELISTS_DIR = {self.storage}/lists/
LOG_DIR = {root}/
PID_DIR = {root}/
USER =
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = {self.carbon_port}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = {pickle_port}
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = {query_port}
LOG_UPDATES = False
ENABLE_TAGS = False
TAG_HASH_FILENAMES = False
LOG_LISTENER_CONNECTIONS = False
""")
        (root / "storage-schemas.conf").write_text("[stats]\npattern = ^stats\\.\nretentions = 1s:1h\n"
                                                   "[default]\npattern = .*\nretentions = 1s:1h\n")
        (root / "storage-aggregation.conf").write_text("[default]\npattern = .*\nxFilesFactor = 0\n"
                                                       "aggregationMethod = average\n")
        (root / "statsd.js").write_text(f"""{{
  graphitePort: {self.carbon_port}, graphiteHost: "127.0.0.1", address: "127.0.0.1", port: {self.statsd_port},
  mgmt_address: "127.0.0.1", mgmt_port: {mgmt_port}, flushInterval: 1000,
  backends: ["./backends/graphite"], graphite: {{ legacyNamespace: false, globalPrefix: "stats" }},
  deleteIdleStats: true
}}""")
        env = dict(os.environ, GRAPHITE_ROOT=str(root), GRAPHITE_CONF_DIR=str(root))
        self.carbon = subprocess.Popen(
            [str(CARBON), f"--config={root / 'carbon.conf'}", "--nodaemon", f"--logdir={root}",
             f"--pidfile={root / 'carbon.pid'}", "start"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.statsd: subprocess.Popen | None = None
        try:
            _wait_listening(self.carbon_port, self.carbon, "carbon-cache")
            self.statsd = subprocess.Popen(["node", str(STATSD_JS), str(root / "statsd.js")], cwd=STATSD_JS.parent,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_listening(mgmt_port, self.statsd, "statsd")
        except BaseException:
            self.stop()
            raise

    def fetch(self, metric: str, seconds: int = 600) -> list[float]:
        """The non-empty points of ``metric`` (dotted; with ``;tag=value``s sorted by tag: a Graphite tagged
        series, which carbon keeps under ``_tagged/``) in the last ``seconds``; [] while its file is missing."""
        if ";" in metric:
            found = list(self.whisper_dir.glob(f"_tagged/*/*/{metric.replace('.', '_DOT_')}.wsp"))
            if not found:
                return []
            path = found[0]
        else:
            path = self.whisper_dir.joinpath(*metric.split(".")).with_suffix(".wsp")
        if not path.exists():
            return []
        out = subprocess.run([str(WHISPER_FETCH), f"--from={int(time.time()) - seconds}", str(path)],
                             capture_output=True, text=True, check=True).stdout
        return [float(v) for _, v in (line.split() for line in out.splitlines()) if v != "None"]

    def wait_for(self, metric: str, predicate, timeout: float = 30) -> list[float]:
        """Re-read ``metric`` until ``predicate(points)`` holds (StatsD flushes every second, carbon
        writes about half a second later); raise with the last points if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            points = self.fetch(metric)
            if predicate(points):
                return points
            if time.monotonic() > deadline:
                raise AssertionError(f"{metric}: {points} never satisfied the check")
            gevent.sleep(0.25)  # the whisper file changes on carbon's schedule; no event to wait on

    def stop(self) -> None:
        for proc in (self.statsd, self.carbon):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

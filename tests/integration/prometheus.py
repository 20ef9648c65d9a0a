"""A real Prometheus (Debian's ``prometheus``, from ``scripts/install_test_deps.sh``) scraping a server, and the
Grafana dashboard's queries as Prometheus sees them.

The scrape configuration is ``deploy/prometheus.yml`` itself with its target pointed at the server under test
and a 1 s scrape interval, so the shipped job is what the test runs. The process is started on a free port,
waited on through its ``/-/ready`` and ``/api/v1/targets`` (polled, bounded) and stopped by pid.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import yaml
from gevent import subprocess

from .graphite import free_port
from .server import ROOT

PROMETHEUS = Path("/usr/bin/prometheus")
DASHBOARD = ROOT / "deploy" / "grafana" / "triton-actor-dashboard.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus.yml"
RATE_INTERVAL = "5s"  # what Grafana's $__rate_interval comes to with a 1 s scrape: 4 scrapes and one to spare


def scrape_config(target: str) -> dict[str, Any]:
    """``deploy/prometheus.yml`` scraping ``target`` (host:port) every second."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "triton-actor"]
    job["static_configs"] = [{"targets": [target]}]
    return config


class Prometheus:
    """``prometheus`` on a free loopback port with its TSDB under ``root``; :meth:`query` is /api/v1/query."""

    def __init__(self, root: Path, config: dict[str, Any]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "prometheus.log"
        with open(self.log, "w") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=log)

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = answer.read()
        return json.loads(body) if path.startswith("/api/") else body

    def poll(self, condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
        """Re-check ``condition`` every 0.2 s (Prometheus offers no event to wait on) until true or ``timeout``;
        ``what`` names what did not happen (a callable: evaluated when it times out)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                what = what() if callable(what) else what
                raise AssertionError(f"timed out after {timeout} s waiting for {what}\ntargets: {self.targets()}"
                                     f"\nprometheus log:\n{self.log.read_text()}")
            gevent.sleep(0.2)  # the poll period

    def targets(self) -> list[dict[str, Any]]:
        """The scrape targets with their health and last scrape error (empty until Prometheus answers)."""
        try:
            return self.get("/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            return []

    def wait_target_up(self, timeout: float = 60) -> None:
        def ready() -> bool:
            try:
                return self.get("/-/ready") is not None
            except OSError:
                return False

        def up() -> bool:
            targets = self.targets()
            return bool(targets) and all(t["health"] == "up" for t in targets)

        self.poll(ready, timeout, "prometheus to listen")
        self.poll(up, timeout, "the server's target to be up")

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query_range", query=expr, start=str(start), end=str(end), step=str(step))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def finite(result: list[dict[str, Any]]) -> bool:
    """Some series of an instant query's ``result`` has a number (not NaN: 0/0 while a model is idle)."""
    return any(math.isfinite(float(r["value"][1])) for r in result)


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' collapsed panels included."""
    out = []
    for p in dashboard["panels"]:
        out += [p] if p["type"] != "row" else p.get("panels", [])
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's variables in ``expr`` (``$name`` and ``${name}``) replaced by ``variables``' values."""
    def value(m: re.Match[str]) -> str:
        return variables[m.group(1) or m.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)

"""gunicorn's arbiter, as our deployment uses it: the run directory, rolling restarts, ``--workers N``.

* :func:`on_starting` / :func:`on_exit` / :func:`child_exit` are gunicorn server hooks (``conf/gunicorn.conf.py``
  names them): the arbiter makes the run directory (0700) that its workers share, removes a dead worker's
  control socket, and deletes the directory when it exits.
* :class:`RollingArbiter` replaces workers **one at a time** on HUP: it starts a new worker, waits until that
  worker is serving (its ready marker), then stops one old worker (SIGTERM: it drains), and so on. gunicorn's
  own reload starts every new worker and stops every old one at once, which leaves no worker serving while
  the new ones load their models. :func:`when_ready` turns the arbiter into one (the config file cannot
  name an arbiter class).
* :func:`run` is ``triton-actor --workers N``: the same configuration, without a config file.

Thread: the arbiter is a plain (unpatched) process; these run in its main loop.
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from ..config.settings import Settings
from .gunicorn_worker import ARGS_ENV, RUN_DIR_ENV

WORKER_CLASS = "triton_actor.workers.gunicorn_worker.TritonWorker"
READY_WAIT_S = 600.0  # a new worker loads every model before it serves


def on_starting(arbiter: Arbiter) -> None:
    run_dir = tempfile.mkdtemp(prefix="triton-actor-")  # mkdtemp makes it 0700
    os.environ[RUN_DIR_ENV] = run_dir
    arbiter.log.info("triton_actor: run directory %s", run_dir)
    preload(arbiter)


# What each backend's runtime imports: loaded once in the arbiter, the workers share those pages
# (copy-on-write). Model instances are not: sessions and their threads do not survive a fork.
_RUNTIMES = {"onnxruntime": ("numpy", "onnxruntime"), "pytorch": ("numpy", "torch"), "python": ("numpy",)}


def preload(arbiter: Arbiter) -> None:
    """Import the runtimes the repositories' models use, before the workers fork (a fast path: off
    with the others, ``TRITON_ACTOR_FAST_PATHS=0``)."""
    settings = parse_args()
    if not settings.fast_paths:
        return
    wanted: set[str] = set()
    for repo in settings.model_repositories:
        for config in Path(repo).glob("*/config.pbtxt"):
            text = config.read_text(errors="replace")
            for backend, modules in _RUNTIMES.items():
                if backend in text:
                    wanted.update(modules)
    for module in sorted(wanted):
        try:
            importlib.import_module(module)
        except ImportError as e:
            arbiter.log.warning("triton_actor: cannot preload %s: %s", module, e)
    if wanted:
        arbiter.log.info("triton_actor: preloaded %s", ", ".join(sorted(wanted)))


def parse_args() -> Settings:
    from ..config.command_line import parse

    return parse(shlex.split(os.environ.get(ARGS_ENV, "")))


def when_ready(arbiter: Arbiter) -> None:
    if not isinstance(arbiter, RollingArbiter):
        arbiter.__class__ = RollingArbiter


def child_exit(arbiter: Arbiter, worker: Any) -> None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        Path(run_dir, "workers", f"{worker.pid}.sock").unlink(missing_ok=True)
        Path(run_dir, "ready", str(worker.pid)).unlink(missing_ok=True)


def on_exit(arbiter: Arbiter) -> None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)


class RollingArbiter(Arbiter):
    """HUP replaces the workers one at a time, each new one serving before an old one stops."""

    _rolling: list[int] | None = None

    def reload(self) -> None:
        self._rolling = [pid for pid, _ in sorted(self.WORKERS.items(), key=lambda w: w[1].age)]
        try:
            super().reload()
        finally:
            self._rolling = None

    def spawn_worker(self) -> int:
        pid = super().spawn_worker()  # the child never returns from this
        if self._rolling:
            if self._wait_ready(pid):
                old = self._rolling.pop(0)
                self.log.info("rolling restart: worker %s serves; stopping worker %s", pid, old)
                self.kill_worker(old, 15)
            else:
                self.log.error("rolling restart: worker %s did not start serving; old workers kept", pid)
                self._rolling = []
        return pid

    def _wait_ready(self, pid: int) -> bool:
        marker = Path(os.environ[RUN_DIR_ENV], "ready", str(pid))
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            if marker.exists():
                return True
            self.reap_workers()
            if pid not in self.WORKERS:
                return False
            time.sleep(0.05)
        return False


def gunicorn_options(settings: Settings, argv: list[str]) -> dict[str, Any]:
    """The gunicorn settings for ``settings`` (also what ``conf/gunicorn.conf.py`` sets)."""
    binds = [f"{settings.http_address}:{settings.http_port}", f"{settings.grpc_address}:{settings.grpc_port}"]
    if settings.allow_metrics:  # third listener: every worker answers /metrics with the host's totals
        binds.append(f"{settings.metrics_address}:{settings.metrics_port}")
    os.environ[ARGS_ENV] = shlex.join(argv)
    return {
        "bind": binds,
        "workers": settings.workers,
        "worker_class": WORKER_CLASS,
        "timeout": 120,
        "graceful_timeout": int(settings.exit_timeout_secs),
        "on_starting": on_starting,
        "when_ready": when_ready,
        "child_exit": child_exit,
        "on_exit": on_exit,
        "control_socket_disable": True,
        # --reuse-http-port / --reuse-grpc-port: gunicorn's one switch binds all its listeners with SO_REUSEPORT
        "reuse_port": settings.reuse_http_port or dict(settings.grpc_options).get("grpc.so_reuseport", 0) == 1,
    }


class _Application(BaseApplication):
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        from .gunicorn_worker import unused_app

        return unused_app


def run(settings: Settings, argv: list[str]) -> None:
    """``triton-actor --workers N``: our flags go to every worker; the arbiter runs until signalled."""
    RollingArbiter(_Application(gunicorn_options(settings, argv))).run()

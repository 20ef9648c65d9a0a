"""The gunicorn worker class: gunicorn's arbiter, signals and worker management; our server in each worker.

``gunicorn -c conf/gunicorn.conf.py`` (or ``triton-actor --workers N``) binds the HTTP and gRPC ports in the
arbiter (in that order: ``bind = [http, grpc]``) and forks workers of this class. Each worker:

1. patches gevent (``triton_actor.bootstrap``, after the fork: the arbiter stays unpatched),
2. builds the server from ``TRITON_ACTOR_ARGS`` (the ``triton-actor`` flags) and a
   :class:`~.worker_host.WorkerHost` on the arbiter's run directory (``TRITON_ACTOR_RUN_DIR``),
3. joins the host (registers its control socket, reads the journal), loads its models and replays the
   journal, and only then serves the arbiter's listening sockets -- a worker never accepts a connection it
   cannot answer, so a rolling restart fails no request,
4. heartbeats the arbiter until SIGTERM (drain: in-flight requests finish, then it exits) or SIGQUIT/INT.

Thread: the worker's main greenlet runs :meth:`run`; the server's actors run on the same hub.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
from typing import Any

from gunicorn.workers.base import Worker

log = logging.getLogger("triton_actor.workers")

ARGS_ENV = "TRITON_ACTOR_ARGS"
RUN_DIR_ENV = "TRITON_ACTOR_RUN_DIR"


def unused_app(environ: Any, start_response: Any) -> list[bytes]:
    """gunicorn insists on a WSGI application; our worker serves with its own HTTP server instead."""
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not served through WSGI\n"]


class TritonWorker(Worker):
    """One worker process running the whole actor tree and both front ends."""

    def init_process(self) -> None:
        import gevent.hub
        import gevent.socket

        from .. import bootstrap  # noqa: F401 - patch in the worker, before our modules import

        gevent.hub.reinit()
        # gunicorn's listeners, re-wrapped as cooperative sockets (as gunicorn's own gevent worker does)
        self.sockets = [gevent.socket.socket(s.FAMILY, gevent.socket.SOCK_STREAM, fileno=s.sock.detach())
                        for s in self.sockets]
        try:
            super().init_process()  # serves until the worker drained and its server stopped
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        self._exit(code)

    def _exit(self, code: int) -> None:
        """End the worker without the C-level teardown of an interpreter exit. The arbiter imported the
        runtimes before it forked (``arbiter.preload``), and importing onnxruntime starts a native thread:
        this process inherited that thread's C++ object but not the thread, so the library's static
        destructors join a thread that does not exist (``std::system_error: Invalid argument``, then
        SIGABRT; SIGSEGV in some runs). The server already stopped and released everything it holds,
        so what is left is to flush the logs, as a forked child of ``multiprocessing`` ends."""
        log.info("Worker exiting (pid: %s)", self.pid)  # gunicorn's own line, whose ``finally`` is skipped
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed or broken stream: nothing more can reach it
        os._exit(code)

    def load_wsgi(self) -> None:
        self.wsgi = unused_app

    def handle_quit(self, sig: int, frame: Any) -> None:
        """SIGQUIT / SIGINT: the serving loop ends (``alive``) and the worker drains and exits. gunicorn's
        own quit would ``sys.exit`` from a greenlet, which the server's hub does not let end the
        process (runtime/hub_errors.py); the arbiter still kills a worker slower than its graceful timeout."""
        import gevent

        self.alive = False
        gevent.spawn(self.cfg.worker_int, self)  # the hook, out of the signal handler

    def run(self) -> None:
        import gevent
        from gunicorn.arbiter import Arbiter

        from ..config.command_line import configure_logging, log_ignored_flags, parse
        from ..host.handlers import replay
        from ..runtime import fastpath, gc_settle
        from ..server import Server, StartupError
        from .worker_host import WorkerHost

        settings = parse(shlex.split(os.environ.get(ARGS_ENV, "")))
        settings = dataclasses.replace(settings, workers=self.cfg.workers)  # instance counts are per host
        fastpath.set_enabled(settings.fast_paths)
        configure_logging(settings)
        if self.age == 1:  # said once for the host, not by every worker
            log_ignored_flags(settings)
        host = WorkerHost(os.environ[RUN_DIR_ENV], self.age, self.pid)
        server = Server(settings, host=host)
        server.start_actors()
        changes = host.join()  # from here on, every host-wide change reaches this worker too
        try:
            server.load_models()
        except StartupError as e:  # like Triton with --exit-on-error: the arbiter stops the server
            log.error("worker %d: %s; exiting (--exit-on-error=true)", self.age, e)
            host.leave()
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
        budget = server.plane.budget  # with a memory budget, what the replayed loads hold is this worker's share
        errors = budget.adopt(lambda: replay(host, changes)) if budget is not None else replay(host, changes)
        for error in errors:
            log.error("worker %d: replaying a host-wide change failed: %s", self.age, error)
        gc_settle.settle()  # before it serves (runtime/gc_settle.py)
        server.serve(dict(zip(("http", "grpc", "metrics"), self.sockets, strict=False)))
        server.plane.accepting = True
        host.mark_ready()
        log.info("worker %d (pid %d) is serving", self.age, self.pid)
        while self.alive:
            self.notify()
            if self.ppid != os.getppid():
                log.info("worker %d: the arbiter is gone; shutting down", self.age)
                break
            gevent.sleep(1.0)
        host.leave()  # host-wide changes stop reaching this worker; then it drains and exits
        server.stop(handover=True)

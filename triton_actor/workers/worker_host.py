"""The multi-worker :class:`~..host.base.Host`: gathers and broadcasts over the workers' control sockets.

Owner: one per worker process, made by the gunicorn worker class before the server starts. Peers are the
sockets in ``<run_dir>/workers/``; a socket nobody answers on belongs to a worker that died (the arbiter
replaces it and the new one replays the journal), so it is removed and left out.

Changes (``broadcast`` of a journaled kind, see ``journal.change_key``) run under the control lock: this
worker first (its error fails the request before anything changed elsewhere), then every peer; if a peer
fails, the change is undone where it was applied and the peer's error is raised. The journal is read
and its next contents made (refused when over its bound) before the change, written after it, both on
a native thread. Reads (``gather``) take no lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.pool

from ..errors import Code, TritonError
from ..host.base import LocalHost
from ..runtime.bridge import call_in_thread
from . import control
from .journal import Change, Journal, change_key, latest, locked
from .resources import HostUnits

log = logging.getLogger("triton_actor.workers")

GATHER_TIMEOUT_S = 10.0
CHANGE_TIMEOUT_S = 600.0  # a model load on every worker: as long as a load may take


class WorkerHost(LocalHost):
    """This worker's view of the host; ``worker_id`` is gunicorn's worker age (1, 2, ...)."""

    journals = True  # a load's config text is journaled and sent to the other workers: kept as text

    def __init__(self, run_dir: str | Path, worker_id: int, pid: int | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.worker_id = worker_id
        self.pid = pid or os.getpid()
        self.journal = Journal(self.run_dir)
        self.booted = gevent.event.Event()  # set once startup loads and the journal replay are done
        (self.run_dir / "workers").mkdir(exist_ok=True)
        (self.run_dir / "ready").mkdir(exist_ok=True)
        self.socket_path = str(self.run_dir / "workers" / f"{self.pid}.sock")
        self._server: control.ControlServer | None = None
        self._units: HostUnits | None = None

    def shared_units(self) -> HostUnits:
        """The rate limiter's units, shared by every worker (workers/resources.py)."""
        if self._units is None:
            self._units = HostUnits(self.run_dir)
        return self._units

    def exclusive(self, name: str, timeout: float) -> contextlib.AbstractContextManager[None]:
        """The host's lock ``name`` (a file in the run directory; the kernel lets it go if this worker dies).
        Not ``control``: a holder of it broadcasts changes, which take the control lock."""
        assert name != "control"
        return locked(self.run_dir, timeout, name)

    # -- lifecycle (the worker class calls these) --------------------------------------------------
    def join(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Register this worker's control socket and read the journal, atomically with respect to
        changes: every change is either in the returned journal or will be sent to this worker."""
        with locked(self.run_dir, CHANGE_TIMEOUT_S):
            self._server = control.ControlServer(self.socket_path, self._dispatch)
            self._server.start()
            return call_in_thread(self.journal.read)

    def mark_ready(self) -> None:
        self.booted.set()
        (self.run_dir / "ready" / str(self.pid)).touch()

    def leave(self) -> None:
        for path in (self.run_dir / "ready" / str(self.pid),):
            path.unlink(missing_ok=True)
        if self._server is not None:
            self._server.stop()

    def _dispatch(self, kind: str, args: dict[str, Any]) -> Any:
        if change_key(kind, args) is not None and not self.booted.is_set():
            self.booted.wait(CHANGE_TIMEOUT_S)  # a change waits for the boot replay, so it lands after it
        return self.local(kind, args)

    # -- peers -------------------------------------------------------------------------------------
    def peers(self) -> list[str]:
        return sorted(str(p) for p in (self.run_dir / "workers").glob("*.sock") if str(p) != self.socket_path)

    def _call(self, path: str, kind: str, args: dict[str, Any], timeout: float) -> tuple[bool, Any]:
        """(answered, answer or error); a peer that is gone answers (False, None)."""
        try:
            return True, control.call(path, kind, args, timeout)
        except TritonError as e:
            if e.code == Code.UNAVAILABLE and "cannot be reached" in e.message:
                log.warning("worker %s is gone; leaving it out", Path(path).stem)
                Path(path).unlink(missing_ok=True)
                return False, None
            return True, e

    def _fan_out(self, kind: str, args: dict[str, Any], timeout: float) -> list[tuple[str, bool, Any]]:
        peers = self.peers()
        results = gevent.pool.Pool(16).map(lambda p: (p, *self._call(p, kind, args, timeout)), peers)
        return list(results)

    def gather(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]:
        args = args or {}
        answers = [self.local(kind, args)]
        for path, answered, answer in self._fan_out(kind, args, GATHER_TIMEOUT_S):
            if not answered:
                continue
            if isinstance(answer, TritonError):
                log.warning("worker %s left out of %r: %s", Path(path).stem, kind, answer.message)
                continue
            answers.append(answer)
        return answers

    def broadcast(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]:
        args = args or {}
        if change_key(kind, args) is None:
            return [self.local(kind, args), *(a for _, ok, a in self._fan_out(kind, args, CHANGE_TIMEOUT_S) if ok)]
        with locked(self.run_dir, CHANGE_TIMEOUT_S):
            known = kind != "model.unload" or self.local("model.known", {"name": args["name"]})
            # the journal's file work on a native thread: a big journal must not hold the hub
            journal, data = call_in_thread(self.journal.prepare, kind, args, known)  # refused: nothing changed
            undo = self._undo_for(kind, args, journal)
            answers = [self.local(kind, args)]  # raises before any other worker changed
            results = self._fan_out(kind, args, CHANGE_TIMEOUT_S)
            failed = [(p, a) for p, ok, a in results if ok and isinstance(a, TritonError)]
            if failed:
                self._undo(undo, [p for p, ok, a in results if ok and not isinstance(a, TritonError)])
                path, error = failed[0]
                log.warning("worker %s refused %r: %s", Path(path).stem, kind, error.message)
                # the client is not told which process (its pid) refused: the log is
                raise TritonError(error.code, f"{error.message} (on another worker; the change was undone on "
                                              "every worker)")
            call_in_thread(self.journal.commit, data)
            answers += [a for _, ok, a in results if ok]
            return answers

    def _undo_for(self, kind: str, args: dict[str, Any], journal: list[Change]) -> tuple[str, dict[str, Any]] | None:
        """The change that puts a worker back as it is now, for the kinds a worker can fail alone."""
        if kind == "model.load":
            previous = latest(journal, f"model:{args['name']}")
            if previous is not None and previous[1] == "model.load":
                return previous[1], previous[2]
            if self.local("model.ready", {"name": args["name"]}):
                return "model.load", {"name": args["name"], "config": None, "files": {}}
            return "model.unload", {"name": args["name"], "unload_dependents": False}
        if kind == "shm.register":
            return "shm.unregister", {"kind": args["kind"], "name": args["name"]}
        return None

    def _undo(self, undo: tuple[str, dict[str, Any]] | None, peers: list[str]) -> None:
        if undo is None:
            return
        kind, args = undo
        for target in [None, *peers]:
            try:
                if target is None:
                    self.local(kind, args)
                else:
                    self._call(target, kind, args, CHANGE_TIMEOUT_S)
            except TritonError as e:
                log.error("undoing a failed %s on %s: %s", kind, target or "this worker", e.message)

"""The journal: host-wide desired state that is not in the repository's files, and the lock that orders
changes to it (see the package docstring for who owns what).

State (``journal.json``, rewritten whole with an atomic rename)::

    {"changes": [[key, kind, args], ...]}

one entry per key (``model:<name>``, ``down:<name>:<version>``, ``shm:<kind>:<name>``, ``log``,
``trace:<model>``), the latest change last, so replaying the list in order rebuilds the state. Log and
trace changes are merged per key. ``down:`` (a version that lost its instances, hostwide.LostVersions)
comes after the load it took down; a later load or unload of that model drops it.

Lock: :func:`locked` takes an exclusive ``flock`` on ``control.lock``, polling without blocking the hub
(a native thread stuck in ``flock`` could hold the lock after its greenlet was killed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import orjson

from ..errors import TritonError
from ..protocol.control import _decode_value, _encode_value

Change = tuple[str, str, dict[str, Any]]


def change_key(kind: str, args: dict[str, Any]) -> str | None:
    """The journal key a change of ``kind`` replaces, or None when ``kind`` is not journaled."""
    if kind in ("model.load", "model.unload"):
        return f"model:{args['name']}"
    if kind == "model.down":
        return f"down:{args['name']}:{args['version']}"
    if kind in ("shm.register", "shm.unregister"):
        return f"shm:{args['kind']}:{args['name']}"
    if kind == "runtime.log":
        return "log"
    if kind == "runtime.trace":
        return f"trace:{args.get('model', '')}"
    return None


class Journal:
    """Reads and writes ``journal.json`` in ``run_dir``; callers hold :func:`locked`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "journal.json"

    def read(self) -> list[Change]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        return [(k, kind, _decode_value(args)) for k, kind, args in data["changes"]]

    def record(self, kind: str, args: dict[str, Any]) -> None:
        key = change_key(kind, args)
        if key is None:
            return
        changes = self.read()
        previous = next((c for c in changes if c[0] == key), None)
        changes = [c for c in changes if c[0] != key]
        if kind in ("runtime.log", "runtime.trace") and previous is not None:
            merged = dict(previous[2].get("changes", {}))
            merged.update(args.get("changes", {}))
            args = dict(args, changes=merged)
        if kind in ("model.load", "model.unload"):  # brings the model back, or takes it away: no longer down
            changes = [c for c in changes if not c[0].startswith(f"down:{args['name']}:")]
        if kind == "shm.unregister" and args["name"] == "":
            changes = [c for c in changes if not c[0].startswith(f"shm:{args['kind']}:")]
        elif kind != "shm.unregister":  # an unregistered region leaves nothing to replay
            changes.append((key, kind, args))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({"changes": [[k, c, _encode_value(a)] for k, c, a in changes]}))
        os.replace(tmp, self.path)

    def latest(self, key: str) -> Change | None:
        return next((c for c in self.read() if c[0] == key), None)


@contextlib.contextmanager
def locked(run_dir: str | Path, timeout: float) -> Iterator[None]:
    """Hold the host's control lock (exclusive) for the block; TritonError UNAVAILABLE after ``timeout``."""
    fd = os.open(Path(run_dir) / "control.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        delay = 0.001
        with gevent.Timeout(timeout, TritonError.unavailable(
                f"another model-control change held the server's control lock for over {timeout:.0f} s")):
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    gevent.sleep(delay)
                    delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

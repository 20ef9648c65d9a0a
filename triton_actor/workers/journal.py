"""The journal: host-wide desired state that is not in the repository's files, and the lock that orders
changes to it (see the package docstring for who owns what).

State (``journal.json``, rewritten whole with an atomic rename)::

    {"changes": [[key, kind, args], ...]}

one entry per key (``model:<name>``, ``down:<name>:<version>``, ``shm:<kind>:<name>``, ``log``,
``trace:<model>``), the latest change last, so replaying the list in order rebuilds the state. Log and
trace changes are merged per key. ``down:`` (a version that lost its instances, hostwide.LostVersions)
comes after the load it took down; a later load or unload of that model drops it. What may be kept, and
the size bound, are :class:`Journal`'s.

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


# Every change rewrites the file whole and a worker that starts reads it whole (measured: 64 MiB took
# 0.5 s to encode and write and 0.4 s to read and decode, 256 MiB 2 s and 3.5 s), under the control
# lock that every other change waits for. 128 MiB holds twice the largest load HTTP accepts (a 64 MiB
# body, file overrides in base64 as they are here) and keeps a change near a second.
MAX_BYTES = 128 * 1024 * 1024


class Journal:
    """Reads and writes ``journal.json`` in ``run_dir``; callers hold :func:`locked`.

    Desired state only, so its size is bounded by what is live, not by how many requests came: one
    entry per key (a change replaces its key's entry, so the file is compacted on every write), a
    model's entries only for a model this worker knows (an unload of an unknown name changes nothing
    and is not kept: 62 of 1 MiB names made a 146 MB journal that every later change read and rewrote),
    an unregistered region removed, and at most :data:`MAX_BYTES` in all (a change that would pass it
    is refused before it is made anywhere).

    Thread: the methods do blocking file I/O and JSON work; the workers' host calls :meth:`prepare`,
    :meth:`commit` and :meth:`read` through ``bridge.call_in_thread``, never on the hub."""

    def __init__(self, run_dir: str | Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(run_dir) / "journal.json"
        self.max_bytes = max_bytes

    def read(self) -> list[Change]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        return [(k, kind, _decode_value(args)) for k, kind, args in data["changes"]]

    def prepare(self, kind: str, args: dict[str, Any], known: bool = True) -> tuple[list[Change], bytes | None]:
        """(the entries now, the file's next contents or None when nothing is to be written). ``known``:
        whether this worker has the model of a ``model.unload`` (see :func:`apply`). Raises TritonError
        INVALID_ARG when the journal would pass :attr:`max_bytes`."""
        changes = self.read()
        after = apply(changes, kind, args, known)
        if after is None:
            return changes, None
        data = orjson.dumps({"changes": [[k, c, _encode_value(a)] for k, c, a in after]})
        if len(data) > self.max_bytes:
            raise TritonError.invalid_arg(
                f"{kind} '{_short(args.get('name', args.get('model', '')))}' would make the server's host-wide "
                f"journal {len(data)} bytes, over its limit of {self.max_bytes} (with --workers, explicit loads "
                f"with their overrides, shared-memory registrations and settings are kept there)")
        return changes, data

    def commit(self, data: bytes | None) -> None:
        """Write what :meth:`prepare` returned (an atomic rename: a reader sees the old or the new file)."""
        if data is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def record(self, kind: str, args: dict[str, Any], known: bool = True) -> None:
        self.commit(self.prepare(kind, args, known)[1])

    def latest(self, key: str) -> Change | None:
        return latest(self.read(), key)


def latest(changes: list[Change], key: str) -> Change | None:
    return next((c for c in changes if c[0] == key), None)


def apply(changes: list[Change], kind: str, args: dict[str, Any], known: bool = True) -> list[Change] | None:
    """The entries after ``kind``, or None when it leaves them as they are (not journaled, or an unload
    of a model that is neither ``known`` here nor in the journal: Triton answers it with success and
    nothing changed, so a worker that starts later has nothing to replay)."""
    key = change_key(kind, args)
    if key is None:
        return None
    previous = latest(changes, key)
    if kind == "model.unload" and not known and previous is None:
        return None
    before, changes = changes, [c for c in changes if c[0] != key]
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
    return None if changes == before else changes  # e.g. an unregister of a region nobody registered


def _short(name: str, limit: int = 64) -> str:
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name)} characters)"


@contextlib.contextmanager
def locked(run_dir: str | Path, timeout: float, name: str = "control") -> Iterator[None]:
    """Hold the host's lock ``name`` (exclusive; ``control``: the control lock) for the block; TritonError
    UNAVAILABLE after ``timeout``."""
    fd = os.open(Path(run_dir) / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        delay = 0.001
        what = "model-control change held the server's control lock" if name == "control" else f"worker held the {name} lock"
        with gevent.Timeout(timeout, TritonError.unavailable(f"another {what} for over {timeout:.0f} s")):
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

"""The rate limiter's resources across the workers of a host (``--rate-limit=execution_count`` with ``--workers``).

Triton's resources belong to the one server: a global resource of count 1 is held by one instance of one
model at a time, whatever the model. With N worker processes, each worker's limiter
(actors/scheduling/rate_limiter.py) keeps its own line and, for the head of that line, takes the units from
here: :class:`HostUnits` is the :class:`~..actors.scheduling.rate_limiter.SharedUnits` of a worker.

Each resource (name and device, or global) is one file in ``<run_dir>/resources/``, and its units are
byte-range locks (``lockf``) on it: byte 0 is the resource's *turn*, bytes 1..COUNT its units. The kernel
keeps the locks, so

* a unit is held by one worker at a time (a lock another process holds refuses ``LOCK_NB``),
* a worker that dies (killed, crashed) gives back every unit it held: the kernel drops a process's record
  locks when it exits, with no one having to notice,
* a take costs a few lock calls per resource (no file I/O, no message, no other process woken).

Record locks belong to the process, not to the descriptor: a second lock of a byte this process holds
succeeds, so which units this worker holds is also kept here (``_held``), and the local limiter never
asks for more units than the resource has.

The turn: a worker that finds a resource's units taken keeps the resource's turn (byte 0) while it waits;
a worker that has given units back takes the turn before it takes a unit again, so it cannot take back
at once what the waiting worker waits for (the two alternate instead of one starving the other).

Thread: the hub; lock calls with ``LOCK_NB`` never block. The files live as long as the run directory
(one per resource name and device, so a few).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

Key = tuple[str, int]
Lease = list[tuple[Key, int]]  # (resource, unit byte)


class HostUnits:
    """One worker's side of the host's resource units; see the module docstring."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / "resources"
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self._files: dict[Key, int] = {}  # resource → the descriptor of its file (kept open: closing drops locks)
        self._held: dict[Key, set[int]] = {}  # resource → units (bytes) this worker holds
        self._turn: Key | None = None  # the resource whose turn this worker keeps while it waits

    def _file(self, key: Key) -> int:
        fd = self._files.get(key)
        if fd is None:
            name, device = key
            path = self.folder / f"{name.encode().hex() or '-'}@{device}"  # any name, one safe file name
            fd = self._files[key] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return fd

    def take(self, resources: tuple[tuple[Key, int], ...], totals: dict[Key, int]) -> Lease | None:
        lease: Lease = []
        for key, count in resources:  # sorted by key (Needs): two workers never wait for each other's units
            fd = self._file(key)
            if not _lock(fd, 0):  # another worker waits for this resource: its turn first
                self._drop(lease)
                self.stop_waiting()
                return None
            held = self._held.setdefault(key, set())
            got = []
            for unit in range(1, totals.get(key, 0) + 1):
                if len(got) == count:
                    break
                if unit not in held and _lock(fd, unit):
                    got.append(unit)
            lease += [(key, unit) for unit in got]
            held.update(got)
            if len(got) < count:  # some are another worker's: keep this resource's turn and wait
                self._drop(lease)
                if self._turn not in (None, key):
                    self.stop_waiting()
                self._turn = key
                return None
            _unlock(fd, 0)
            if self._turn == key:
                self._turn = None
        self.stop_waiting()
        return lease

    def give(self, lease: Lease) -> None:
        self._drop(lease)

    def stop_waiting(self) -> None:
        if self._turn is not None:
            _unlock(self._file(self._turn), 0)
            self._turn = None

    def _drop(self, lease: Lease) -> None:
        for key, unit in lease:
            _unlock(self._files[key], unit)
            self._held[key].discard(unit)


def _lock(fd: int, byte: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
        return True
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise


def _unlock(fd: int, byte: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, byte)

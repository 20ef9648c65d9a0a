"""The log of a server subprocess (``python -m triton_actor`` or gunicorn): its stderr read line by line in a
greenlet, every line kept and handed to the harness (which picks the ports, the ready line, the serving
workers out of it), and waits on a condition over what was read -- woken by each line, never polling."""

from __future__ import annotations

from collections.abc import Callable

import gevent
import gevent.event
from gevent import subprocess


class ServerLog:
    """Reads ``proc.stderr`` (text) until it ends; ``on_line(line)`` runs in the reader greenlet first."""

    def __init__(self, proc: subprocess.Popen, on_line: Callable[[str], None]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.ended = False  # the stream reached its end (the process and its children closed it)
        self._on_line = on_line
        self._changed = gevent.event.Event()
        self._reader = gevent.spawn(self._read)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                line = line.rstrip("\n")
                self.lines.append(line)
                self._on_line(line)
                self._changed.set()
        finally:
            self.ended = True
            self._changed.set()

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition()`` holds, the log ends or the process exits (then what it wrote last is
        read first), at most ``timeout`` s; the condition's value."""
        with gevent.Timeout(timeout, False):
            while not condition() and not self.ended:
                if self.proc.poll() is not None:
                    self.join(5)
                    break
                self._changed.clear()
                self._changed.wait(1)  # a line or the end wakes it; the 1 s bound notices an exit
        return condition()

    def join(self, timeout: float | None) -> None:
        """Wait until the log ended (the process exited), at most ``timeout`` s."""
        self._reader.join(timeout)

    def text(self, last: int | None = None) -> str:
        """The log so far (its ``last`` lines)."""
        return "\n".join(self.lines if last is None else self.lines[-last:])

"""What is host-wide when several worker processes serve one port set.

A client must not be able to tell which worker answered (design.md, "Several processes"): statistics and
metrics are sums over workers, model control and shared-memory registrations and the log and trace
settings reach every worker. Everything that needs that goes through a :class:`Host`:

* ``host.register(kind, handler)`` -- this process's handler for a named query or command; ``handler`` takes
  one JSON-able ``dict`` of arguments and returns JSON-able data (it runs in a greenlet of its own, on the
  hub; it may block on actors).
* ``host.gather(kind, args)`` -- every live worker's answer, this worker's first: for reads that are summed
  (``statistics``, ``metrics``). A worker that does not answer in time is left out of the sum and logged.
* ``host.broadcast(kind, args)`` -- run a command on every worker and return their answers, this worker's
  first; a worker's error is raised here as :class:`~..errors.TritonError` (the caller decides how to undo).
* ``host.shared_units()`` -- the rate limiter's resources as the host's (None with one process: the
  limiter's own are the server's).
* ``host.exclusive(name, timeout)`` -- a lock held by one worker of the host at a time (a context manager;
  one process: the caller's own serialisation is enough, nothing is taken). Decisions for the whole host
  (the model memory budget's) run under it.

:class:`LocalHost` is the one-process host (no workers): it calls the local handler and nothing else, so the
code that uses it is the same with and without workers. The multi-worker host lives in
``triton_actor/workers/`` and speaks to the other workers over their control sockets.

Owner: the server creates one host per process; handlers are registered at start-up, before serving.
Nothing on the inference hot path goes through a host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from ..actors.scheduling.rate_limiter import SharedUnits
from ..errors import TritonError

Handler = Callable[[dict[str, Any]], Any]


class Host(Protocol):
    """The seam between per-process state and what a client sees host-wide."""

    worker_id: int
    # the changes it keeps (--workers: the journal, for the workers started later): a load's config text
    # must outlive its parse there; in one process the text is dropped once parsed (issue 23)
    journals: bool

    def register(self, kind: str, handler: Handler) -> None: ...

    def gather(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]: ...

    def broadcast(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]: ...

    def shared_units(self) -> SharedUnits | None: ...

    def exclusive(self, name: str, timeout: float) -> contextlib.AbstractContextManager[None]: ...


class LocalHost:
    """One process, no workers: ``gather`` and ``broadcast`` answer with this process's handler alone."""

    worker_id = 0
    journals = False

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def register(self, kind: str, handler: Handler) -> None:
        if kind in self.handlers:
            raise ValueError(f"host handler {kind!r} registered twice")
        self.handlers[kind] = handler

    def local(self, kind: str, args: dict[str, Any] | None = None) -> Any:
        handler = self.handlers.get(kind)
        if handler is None:
            raise TritonError.internal(f"no host handler for {kind!r}")
        return handler(args or {})

    def gather(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]:
        return [self.local(kind, args)]

    def broadcast(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]:
        return [self.local(kind, args)]

    def shared_units(self) -> SharedUnits | None:
        return None

    def exclusive(self, name: str, timeout: float) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

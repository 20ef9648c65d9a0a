"""Load on first request (``--model-load-on-demand``, EXPLICIT or POLL mode): a request for a model that is in a
repository folder but not loaded starts its load, waits for it, then runs.

Triton loads only what its repository or the load API says (its issues #7279, #3583: users ask for this).
Here the data plane asks :meth:`OnDemand.start` when a request names a model that has no ready version;
if the repository holds a folder of that name, one load starts (through the same host call as the load
API, so with ``--workers`` every worker loads it) and every request for the model that arrives meanwhile
waits for that one load. The waiting is bounded: at most :data:`MOST_WAITING` requests wait for loads in
the process (more are refused UNAVAILABLE at once, as a full queue is), each at most its own timeout
(``timeout`` parameter) or the load's; a load that fails answers each waiting request with the load's
error, and the next request tries again.

Only folder names are looked up (no ``/``, no dot names): a request can never make the server read
anything outside the model repositories. Owner: the data plane (hub greenlets); a load runs in a
greenlet of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import gevent

from ..errors import TritonError
from ..runtime.kernel import Reply

log = logging.getLogger(__name__)

# requests waiting for on-demand loads in one process: a burst for 200 cold models queues, a flood of
# requests for models that take minutes to load does not hold unbounded memory
MOST_WAITING = 1024


class OnDemand:
    """The loads started by requests, one per model at a time."""

    def __init__(self, repositories: list[Path], load: Callable[[str], None], most_waiting: int = MOST_WAITING) -> None:
        self._repositories = repositories
        self._load = load  # blocks until the model is loaded; raises its TritonError
        self._loads: dict[str, Reply[None]] = {}
        self.most_waiting = most_waiting
        self.waiting = 0  # requests waiting for a load now
        self.started = 0  # loads started by requests (nv_model_load_on_demand_total)

    def start(self, name: str) -> Reply[None] | None:
        """The load of ``name`` a request can wait for (started now, or already under way); None when no
        repository has a folder of that name."""
        reply = self._loads.get(name)
        if reply is not None:
            return reply
        if not _folder_name(name) or not any((repo / name).is_dir() for repo in self._repositories):
            return None
        reply = self._loads[name] = Reply()
        self.started += 1
        log.info("loading '%s' on demand (a request names it)", name)
        gevent.spawn(self._run, name, reply)
        return reply

    def _run(self, name: str, reply: Reply[None]) -> None:
        try:
            self._load(name)
            reply.set(None)
        except TritonError as e:
            reply.fail(e)
        except Exception as e:
            log.exception("on-demand load of '%s' failed", name)
            reply.fail(TritonError.internal(f"failed to load '{name}': {e!r}"))
        finally:
            self._loads.pop(name, None)

    def wait(self, name: str, load: Reply[None], timeout_us: int) -> None:
        """Wait (this greenlet) for ``load``; Triton-shaped errors when too many wait, the request's
        timeout passes first, or the load failed."""
        if self.waiting >= self.most_waiting:
            raise TritonError.unavailable(
                f"Request for model '{name}' refused: {self.waiting} requests already wait for models to load")
        self.waiting += 1
        try:
            if timeout_us > 0:
                try:
                    load.get(timeout_us / 1e6)
                except TritonError as e:
                    if load.ready():
                        raise
                    raise TritonError.unavailable(
                        f"Request timeout expired while model '{name}' was loading on demand") from e
            else:
                load.get()
        finally:
            self.waiting -= 1


def _folder_name(name: str) -> bool:
    """A name that can only be one folder directly inside a repository."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name

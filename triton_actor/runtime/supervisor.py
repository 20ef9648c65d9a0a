"""The restart budget of a supervisor: how often a child may fail before it is given up on.

Pure policy with an injected clock (as :mod:`..actors.scheduling.batch_queue`): the RepositoryActor asks
:meth:`RestartBudget.allow` each time one of its ModelActors fails in a tell; ``True`` means restart it
(the replacement reloads what was serving), ``False`` means give up (every version of the model
UNAVAILABLE with the reason in the index, until a load or a POLL change loads it again). Same shape as
Erlang/OTP's intensity and period, per child.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Hashable

MAX_RESTARTS = 3  # restarts allowed per child within RESTART_WINDOW_S; the next failure gives up
RESTART_WINDOW_S = 60.0  # long enough that a failure on every reload is caught, short enough that rare ones never add up


class RestartBudget:
    """At most ``max_restarts`` restarts per key in any ``window_s`` seconds (owned by one actor)."""

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._restarts: dict[Hashable, collections.deque[float]] = {}

    def allow(self, key: Hashable) -> bool:
        """A child failed: may it restart? A granted restart is counted; a refusal forgets the key
        (a later load starts with the whole budget)."""
        now = self._clock()
        times = self._restarts.setdefault(key, collections.deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.max_restarts:
            del self._restarts[key]
            return False
        times.append(now)
        return True

    def used(self, key: Hashable) -> int:
        """Restarts of ``key`` counted in the window that ended at the last ``allow``."""
        return len(self._restarts.get(key, ()))

"""Triton's rate limiter (``--rate-limit=execution_count``): an instance runs a batch only while it holds
the resources its instance group names, and the instances that wait for resources go in order of their
priority, across every model of the server.

Semantics, as Triton core's ``rate_limiter.cc`` (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/rate_limiter.md):

- An instance group's ``rate_limiter { resources [ { name, global, count } ] priority }`` gives each of its
  instances its needs: ``count`` copies of ``name`` on the instance's device, or of the one global
  ``name`` when ``global`` is set.
- How many copies exist: with no ``--rate-limit-resource``, the most any loaded instance needs (so every
  instance can run); with some, what they say (``NAME:COUNT`` on every device and for a global resource,
  ``NAME:COUNT:DEVICE`` on one device), and a resource they leave out has none. A load whose instances need
  more than exists fails with Triton's text, as does a resource named both global and per device.
- An instance with work *stages* (:meth:`RateLimiter.ask`); the staged instance with the lowest
  ``executions x priority`` (priority 0 counts as 1) is next, and gets its resources as soon as they are
  free; those behind it wait (Triton allocates the head of the line only). Resources are held while the
  instance runs and given back when its batch is over (:meth:`RateLimiter.give_back`), which counts an
  execution. So an instance of priority 2 runs half as often as one of priority 1 when both always wait.

One departure: an instance whose group names no resources never stages. Triton stages it too, behind a
head of the line that may wait for resources; here it runs as without the limiter (there is nothing to
limit, and such a model pays nothing for the limiter).

With ``--workers`` the resources are the host's, as they are Triton's one server's: each worker keeps its
own line (priorities order the instances of one worker), and a head that fits in its worker also takes
its units from :class:`SharedUnits` (workers/resources.py: a lock per unit in the run directory, which the
kernel gives back when a worker dies); when another worker holds them, the head waits and the limiter
tries again every few milliseconds (:data:`POLL_FIRST_S` up to :data:`POLL_MOST_S`). Between workers a
resource goes to whichever asks first, with one rule for fairness: a worker that waits for a resource
holds its turn, so a worker that gives the resource back cannot take it again at once (the two take
turns). One process: no shared units, nothing changes and nothing is paid.

Owner: the ``Server`` (one limiter for all its models; one per worker process, joined through its shared
units). Hub thread only: the schedulers call it from their handlers; a grant is delivered by calling the
waiter's ``on_grant`` on the hub (the pool turns it into a message to its scheduler).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gevent

from ...errors import TritonError

GLOBAL = -1  # the device key of a global resource
EVERY_DEVICE = -2  # the device of --rate-limit-resource=NAME:COUNT (every device; config/flags.py)
# A head that waits for another worker's units asks again after 0.5 ms, doubling up to 5 ms: a unit given
# back elsewhere is taken within 5 ms, and a waiting worker makes at most 200 tries (a few lock calls
# each, microseconds) a second.
POLL_FIRST_S = 0.0005
POLL_MOST_S = 0.005

Resources = tuple[tuple[tuple[str, int], int], ...]


class SharedUnits(Protocol):
    """The host's units of each resource, shared with the other workers (workers/resources.py)."""

    def take(self, resources: Resources, totals: dict[tuple[str, int], int]) -> Any | None:
        """Every unit ``resources`` names, out of ``totals`` per resource, as a lease; None when another
        worker holds some (nothing is kept then but this worker's turn for the one it waits for)."""
        ...

    def give(self, lease: Any) -> None:
        """Back to the host, what :meth:`take` returned."""
        ...

    def stop_waiting(self) -> None:
        """This worker no longer waits for a resource: its turn goes."""
        ...


@dataclass(frozen=True, slots=True)
class Needs:
    """One instance's rate limiter configuration: ``{(resource name, device or GLOBAL): count}`` and priority."""

    resources: tuple[tuple[tuple[str, int], int], ...]
    priority: int = 1

    @classmethod
    def of_group(cls, group: Any, device: int) -> Needs | None:
        """The needs of an instance of ``group`` (a ``ModelInstanceGroup``) on ``device``; None if it has none."""
        limiter = group.rate_limiter
        wanted: dict[tuple[str, int], int] = {}
        for r in limiter.resources:
            key = (r.name, GLOBAL if getattr(r, "global") else device)
            wanted[key] = wanted.get(key, 0) + r.count
        if not any(wanted.values()):
            return None
        return cls(tuple(sorted(wanted.items())), max(1, limiter.priority))


@dataclass(eq=False, slots=True)
class Waiter:
    """One instance's place with the limiter (:meth:`RateLimiter.register`)."""

    needs: Needs
    name: str  # the instance's, for errors and the status page
    executions: int = 0
    staged: bool = False
    held: bool = False
    on_grant: Callable[[], None] | None = None
    seq: int = field(default=0)
    lease: Any = None  # the host's units it holds (SharedUnits.take), with --workers


class RateLimiter:
    """The resources and the line of staged instances; see the module docstring."""

    def __init__(self, explicit: list[tuple[str, int, int]] | None = None, shared: SharedUnits | None = None) -> None:
        self._explicit = list(explicit or [])
        self._shared = shared  # with --workers: the host's units (None: this process's are the server's)
        self._polling: gevent.Greenlet | None = None  # asks the host again while the head waits for its units
        self._waiters: set[Waiter] = set()
        self._totals: dict[tuple[str, int], int] = {}
        self._used: dict[tuple[str, int], int] = {}
        self._line: list[tuple[int, int, Waiter]] = []  # (executions x priority, arrival, waiter)
        self._arrivals = itertools.count()

    # -- instances come and go --------------------------------------------------------------------
    def register(self, needs_list: list[tuple[Needs, str]]) -> list[Waiter]:
        """Add one version's instances (all or none): Triton's error when the resources cannot ever hold them."""
        added = [Waiter(needs, name) for needs, name in needs_list]
        totals = self._totals_with(self._waiters | set(added))
        self._waiters.update(added)
        self._totals = totals
        self.allocate()  # more copies of a resource may exist now
        return added

    def unregister(self, waiters: list[Waiter]) -> None:
        """Remove instances (their version unloads): what they held or waited for is let go."""
        for w in waiters:
            self.withdraw(w)
            if w.held:
                self._release(w)
            self._waiters.discard(w)
        self._totals = self._totals_with(self._waiters)
        self.allocate()

    def _totals_with(self, waiters: set[Waiter]) -> dict[tuple[str, int], int]:
        most: dict[tuple[str, int], int] = {}
        for w in waiters:
            for key, count in w.needs.resources:
                most[key] = max(most.get(key, 0), count)
        names_global = {name for name, device in most if device == GLOBAL}
        for name, device in most:
            if device != GLOBAL and name in names_global:
                raise TritonError.invalid_arg(
                    f'Resource "{name}" is present as both global and device-specific resource in the model '
                    "configuration.")
        if not self._explicit:
            return most
        totals: dict[tuple[str, int], int] = {}
        for (name, device), needed in most.items():
            given = [count for n, d, count in self._explicit
                     if n == name and (device == GLOBAL or d in (device, EVERY_DEVICE))]
            total = max(given, default=0)
            if total < needed:
                raise TritonError.invalid_arg(
                    f'Resource count for "{name}" is limited to {total} which will prevent scheduling of one or '
                    f"more model instances, the minimum required count is {needed}")
            totals[(name, device)] = total
        return totals

    # -- the line ---------------------------------------------------------------------------------
    def ask(self, waiter: Waiter, on_grant: Callable[[], None]) -> bool:
        """Stage ``waiter`` (its instance has work). True: it holds its resources now (``on_grant`` is not
        called); False: it waits in line and ``on_grant`` is called (hub) once it holds them."""
        assert not waiter.staged and not waiter.held
        waiter.on_grant = on_grant
        waiter.staged = True
        waiter.seq = next(self._arrivals)
        heapq.heappush(self._line, (waiter.executions * waiter.needs.priority, waiter.seq, waiter))
        return self.allocate(waiter)

    def withdraw(self, waiter: Waiter) -> None:
        """Leave the line (its work went elsewhere, or it left its pool)."""
        if waiter.staged:
            waiter.staged = False
            self._line = [e for e in self._line if e[2] is not waiter]
            heapq.heapify(self._line)
            self.allocate()

    def give_back(self, waiter: Waiter, executed: bool = True, allocate: bool = True) -> None:
        """Its batch is over (``executed``: it ran, which counts for its priority): the resources go back
        and the line moves. ``allocate`` False: the caller stages the instance again first if it has more
        work, then calls :meth:`allocate` (Triton re-stages a released instance before it allocates, so an
        instance that always has work keeps its place by priority instead of going behind every other)."""
        if waiter.held:
            self._release(waiter)
            if executed:
                waiter.executions += 1
            if allocate:
                self.allocate()

    def _fits(self, waiter: Waiter) -> bool:
        used, totals = self._used, self._totals
        return all(used.get(key, 0) + count <= totals.get(key, 0) for key, count in waiter.needs.resources)

    def _hold(self, waiter: Waiter) -> None:
        waiter.staged, waiter.held = False, True
        for key, count in waiter.needs.resources:
            self._used[key] = self._used.get(key, 0) + count

    def _release(self, waiter: Waiter) -> None:
        waiter.held = False
        for key, count in waiter.needs.resources:
            self._used[key] -= count
        if waiter.lease is not None:
            assert self._shared is not None
            self._shared.give(waiter.lease)
            waiter.lease = None

    def allocate(self, asker: Waiter | None = None) -> bool:
        """Grant the head of the line while its resources are free (here, and with --workers on the host);
        ``asker`` (staging now) is not called back: True when it got them."""
        line, got, shared = self._line, False, self._shared
        while line and self._fits(line[0][2]):
            waiter = line[0][2]
            if shared is not None:
                waiter.lease = shared.take(waiter.needs.resources, self._totals)
                if waiter.lease is None:  # another worker holds some: the head waits, the line with it
                    self._poll_host()
                    return got
            heapq.heappop(line)
            self._hold(waiter)
            if waiter is asker:
                got = True
            else:
                assert waiter.on_grant is not None
                waiter.on_grant()
        if shared is not None and self._polling is not None:
            shared.stop_waiting()  # nobody here waits for the host any more
            self._polling = None
        return got

    def _poll_host(self) -> None:
        if self._polling is None:
            self._polling = gevent.spawn(self._ask_host_again)

    def _ask_host_again(self) -> None:
        """While the head waits for units another worker holds: ask again (the host's locks cannot wake a
        waiter without a native thread blocked on them, and such a thread outlives a greenlet that stops)."""
        me, delay = gevent.getcurrent(), POLL_FIRST_S
        while self._polling is me:
            gevent.sleep(delay)
            delay = min(delay * 2, POLL_MOST_S)
            if self._polling is me:
                self.allocate()

    def status(self) -> dict[str, Any]:
        """Totals, use and the line (the status page, tests)."""
        return {"resources": {f"{name}@{'global' if d == GLOBAL else d}": [self._used.get((name, d), 0), total]
                              for (name, d), total in sorted(self._totals.items())},
                "waiting": [e[2].name for e in sorted(self._line, key=lambda e: e[:2])],
                "waiting_for_host": self._polling is not None}

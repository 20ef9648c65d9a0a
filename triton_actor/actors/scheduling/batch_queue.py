"""BatchQueue: the queued requests of one model version and the decision of what runs next.

Pure policy, no actors, no gevent, no clock of its own: the owner (a :class:`SchedulerActor`) passes
``now_ns`` in, so tests drive it with a manual clock. Owned by exactly one scheduler.

Semantics are Triton's dynamic batcher (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md, core ``DynamicBatchScheduler::GetDynamicBatch``
and ``PriorityQueue``):

* ``priority_levels`` FIFO levels, 1 the highest; a request's priority 0 or above the levels falls back
  to ``default_priority_level``. Each level has a queue policy: ``max_queue_size`` (full → the
  request is refused with UNAVAILABLE ``Exceeds maximum queue size``), a timeout
  (``default_timeout_microseconds``, or the request's ``timeout`` when ``allow_timeout_override``;
  an override only shortens a default that is set), and the action on expiry: REJECT (the request
  leaves with UNAVAILABLE ``Request timeout expired``) or DELAY (it moves behind the level's
  unexpired requests and waits without a deadline).
* Walking the queue from the oldest request of the highest level, a batch grows while it fits
  ``max_batch_size`` and every input keeps the first request's shape (inputs that allow ragged
  batches excepted); requests are never split. The largest prefix whose size is a preferred batch
  size is remembered.
* Send now: a preferred size was reached before the oldest request waited ``max_queue_delay``; or
  the next request does not fit / has another shape; or the batch reached the largest preferred
  size; or the delay is 0; or the oldest request has waited the delay. Otherwise wait until the
  delay or the closest timeout expires, or more requests arrive.

Without batching (no ``dynamic_batching`` block, or ``max_batch_size`` 0) every request runs alone,
in priority then arrival order.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from ...errors import TritonError

T = TypeVar("T")

_NO_DEADLINE = 1 << 62


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """``ModelQueuePolicy`` of one priority level."""

    delay_on_timeout: bool = False  # timeout_action: REJECT (False) or DELAY (True)
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def deadline(self, now_ns: int, request_timeout_us: int) -> int:
        timeout_ns = self.default_timeout_ns
        if self.allow_timeout_override and 0 < request_timeout_us * 1000 < timeout_ns:
            timeout_ns = request_timeout_us * 1000  # an override only shortens a default that is set (Triton)
        return now_ns + timeout_ns if timeout_ns else _NO_DEADLINE


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """What one version's scheduler does; :meth:`from_config` reads it from a ``ModelConfig``."""

    max_batch_size: int = 0  # 0: every request alone
    preferred: tuple[int, ...] = ()  # ascending
    max_delay_ns: int = 0
    priority_levels: int = 0  # 0: one level
    default_priority: int = 0
    policies: dict[int, QueuePolicy] = field(default_factory=dict)  # level (1-based) → policy
    preserve_ordering: bool = False
    ragged_inputs: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: Any) -> BatchPolicy:
        if not config.HasField("dynamic_batching"):
            return cls()
        db = config.dynamic_batching
        levels = int(db.priority_levels)
        default = _queue_policy(db.default_queue_policy) if db.HasField("default_queue_policy") else QueuePolicy()
        policies = {level: default for level in range(1, max(levels, 1) + 1)}
        for level, policy in db.priority_queue_policy.items():
            if 1 <= level <= levels:
                policies[int(level)] = _queue_policy(policy)
        mbs = max(int(config.max_batch_size), 0)
        preferred = tuple(sorted({int(p) for p in db.preferred_batch_size if 0 < p <= mbs})) or ((mbs,) if mbs else ())
        return cls(
            max_batch_size=mbs,
            preferred=preferred,
            max_delay_ns=int(db.max_queue_delay_microseconds) * 1000,
            priority_levels=levels,
            default_priority=int(db.default_priority_level) if levels else 0,
            policies=policies,
            preserve_ordering=bool(db.preserve_ordering),
            ragged_inputs=frozenset(i.name for i in config.input if i.allow_ragged_batch),
        )


def _queue_policy(p: Any) -> QueuePolicy:
    return QueuePolicy(
        delay_on_timeout=p.timeout_action == 1,
        default_timeout_ns=int(p.default_timeout_microseconds) * 1000,
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    batch_size: int
    key: Hashable
    enqueued_ns: int
    deadline_ns: int


class _Level(Generic[T]):
    __slots__ = ("policy", "timed", "main", "delayed")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.timed = bool(policy.default_timeout_ns)
        self.main: collections.deque[_Entry[T]] = collections.deque()
        self.delayed: collections.deque[_Entry[T]] = collections.deque()

    def __len__(self) -> int:
        return len(self.main) + len(self.delayed)


class Decision(NamedTuple, Generic[T]):
    """What the owner does now: run ``batch`` (if any), fail ``expired`` with ``TIMEOUT_EXPIRED``,
    and, when nothing is ready yet, poll again after ``wait_ns`` (None: only when something changes)."""

    batch: list[T]
    expired: list[T]
    wait_ns: int | None


def timeout_error(prefix: str = "") -> TritonError:
    return TritonError.unavailable(prefix + "Request timeout expired")


class BatchQueue(Generic[T]):
    """Queued requests of one version, by priority level; see the module docstring."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._levels: list[_Level[T]] = [
            _Level(policy.policies.get(level, QueuePolicy())) for level in range(1, max(policy.priority_levels, 1) + 1)
        ]
        self._single = len(self._levels) == 1  # the common case gets the short paths below
        self.size = 0  # requests queued (``len``; read as an attribute by the direct runs: no call)
        self._closest_deadline = _NO_DEADLINE
        self._preferred = frozenset(policy.preferred)
        self._max_preferred = policy.preferred[-1] if policy.preferred else 0

    def __len__(self) -> int:
        return self.size

    @property
    def timed(self) -> bool:
        """Whether a queue policy gives requests a timeout (then even an idle queue checks deadlines)."""
        return any(level.timed for level in self._levels)

    def level_of(self, priority: int) -> int:
        """1-based level of a request priority (Triton's ``InferenceRequest::SetPriority``)."""
        levels = self.policy.priority_levels
        if levels == 0:
            return 1
        if priority == 0 or priority > levels:
            return self.policy.default_priority or 1
        return priority

    def add(self, item: T, batch_size: int, key: Hashable, priority: int, timeout_us: int, now_ns: int) -> None:
        """Queue ``item``; raises UNAVAILABLE when its level is full."""
        level = self._levels[0] if self._single else self._levels[self.level_of(priority) - 1]
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise TritonError.unavailable("Exceeds maximum queue size")
        deadline = _NO_DEADLINE
        if level.timed:
            deadline = policy.deadline(now_ns, timeout_us)
            if deadline < self._closest_deadline:
                self._closest_deadline = deadline
        level.main.append(_Entry(item, batch_size if batch_size > 1 else 1, key, now_ns, deadline))
        self.size += 1

    def clear(self) -> list[T]:
        """Remove and return everything queued (shutdown)."""
        out = [e.item for e in self._entries()]
        for level in self._levels:
            level.main.clear()
            level.delayed.clear()
        self.size = 0
        self._closest_deadline = _NO_DEADLINE
        return out

    def expire(self, now_ns: int) -> list[T]:
        """Apply the timeout actions that are due; returns the rejected requests."""
        return self._expire(now_ns) if self._closest_deadline <= now_ns else []

    def until_deadline(self, now_ns: int) -> int | None:
        """Nanoseconds until the closest request timeout (None: no request has one)."""
        return None if self._closest_deadline == _NO_DEADLINE else max(self._closest_deadline - now_ns, 0)

    def poll(self, now_ns: int) -> Decision[T]:
        """Expire timed-out requests, then decide: a batch to run now, or how long to wait."""
        expired = self._expire(now_ns) if self._closest_deadline <= now_ns else []
        if not self.size:
            return Decision([], expired, None)
        if not self.policy.max_batch_size:
            if self._single and self._levels[0].main:
                self.size -= 1
                return Decision([self._levels[0].main.popleft().item], expired, None)
            return Decision(self._take(1), expired, None)
        count, pending, best, send_now, oldest = self._scan()
        delay = self.policy.max_delay_ns
        delay_exceeded = delay != 0 and now_ns - oldest >= delay
        if best and not delay_exceeded:
            return Decision(self._take(best), expired, None)
        if send_now or delay == 0 or delay_exceeded or pending >= self._max_preferred:
            return Decision(self._take(count), expired, None)
        wait = delay - (now_ns - oldest)
        deadline = self.until_deadline(now_ns)
        return Decision([], expired, wait if deadline is None else min(wait, deadline))

    # -- internals ----------------------------------------------------------------------------------
    def _entries(self) -> Iterable[_Entry[T]]:
        if self._single and not self._levels[0].delayed:
            return self._levels[0].main
        return itertools.chain.from_iterable(dq for level in self._levels for dq in (level.main, level.delayed))

    def _scan(self) -> tuple[int, int, int, bool, int]:
        """Walk from the front: (requests that fit, their total batch size, requests up to the best
        preferred size, whether the walk stopped on a request that cannot join, enqueue time of the
        oldest queued request)."""
        mbs, max_pref, preferred = self.policy.max_batch_size, self._max_preferred, self._preferred
        count = pending = best = 0
        send_now = False
        key: Hashable = None
        oldest = _NO_DEADLINE
        for entry in self._entries():
            if entry.enqueued_ns < oldest:
                oldest = entry.enqueued_ns
            if send_now:
                continue  # only looking for the oldest now
            size = entry.batch_size
            if count == 0:
                key = entry.key
            else:
                if pending + size > max_pref and best == 0:
                    best = count
                if pending + size > mbs or entry.key != key:
                    send_now = True
                    continue
            count += 1
            pending += size
            if pending in preferred:
                best = count
        return count, pending, best, send_now, oldest

    def _take(self, n: int) -> list[T]:
        """Remove the first ``n`` requests in walk order (they are a prefix of it)."""
        out: list[T] = []
        for level in self._levels:
            for dq in (level.main, level.delayed):
                while dq and len(out) < n:
                    out.append(dq.popleft().item)
            if len(out) == n:
                break
        self.size -= len(out)
        return out

    def _expire(self, now_ns: int) -> list[T]:
        """Apply each level's timeout action to requests past their deadline."""
        expired: list[T] = []
        closest = _NO_DEADLINE
        for level in self._levels:
            keep: collections.deque[_Entry[T]] = collections.deque()
            for entry in level.main:
                if entry.deadline_ns <= now_ns:
                    if level.policy.delay_on_timeout:
                        entry.deadline_ns = _NO_DEADLINE
                        level.delayed.append(entry)
                    else:
                        expired.append(entry.item)
                    continue
                keep.append(entry)
                if entry.deadline_ns < closest:
                    closest = entry.deadline_ns
            level.main = keep
        self.size -= len(expired)
        self._closest_deadline = closest
        return expired

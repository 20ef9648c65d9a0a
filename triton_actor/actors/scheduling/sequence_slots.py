"""SequenceSlots: which sequence holds which (instance, slot), their queued requests, and what runs next.

Pure policy, no actors, no gevent, no clock of its own: the owner (a
:class:`~.sequence_scheduler.SequenceSchedulerActor`) passes ``now_ns`` in, so tests drive it with a
manual clock. Owned by exactly one scheduler; items are opaque to it.

Semantics are Triton's sequence batcher (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md, core ``sequence_batch_scheduler.cc``):

* Each instance has ``slots`` slots (``max_batch_size``, 1 without batching; ``max_candidate_sequences``
  with the ``oldest`` strategy). A sequence is bound to one (instance, slot) from its START until its
  END request is dispatched (with ``iterative_sequence``: until its request is released for good), or
  until it was idle ``max_sequence_idle_microseconds``.
* A new sequence with no free slot waits in the backlog, in arrival order, with its requests; it gets
  the first slot that frees.
* A request that is not a START for an id that holds no slot and is not in the backlog is refused
  (Triton's "must specify the START flag" error, raised by :meth:`add`). A START for an active id
  keeps the slot: Triton ends the previous sequence early with a warning and the model sees START.
* ``direct``: a batch for an instance has one entry per slot up to the highest slot with a queued
  request; empty slots are ``None`` (the scheduler sends a null request with READY false). With
  ``max_queue_delay`` it waits for ``minimum_slot_utilization`` of the slots to be ready, at most
  that delay after the oldest head request arrived.
* ``oldest``: a batch holds the oldest head requests of the instance's candidate sequences, at most
  ``max_batch_size``, one per sequence, cut to the largest preferred size reached; with a delay it
  waits for more until the oldest one waited that long.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from ...errors import TritonError

T = TypeVar("T")

SEQUENCE_START = 1
SEQUENCE_END = 2
_NEVER = 1 << 62
# Requests queued for one version across all its sequences (backlog included): past this, a client that
# keeps opening sequences (or sending into one) is refused instead of growing the server's memory.
MAX_QUEUED = 1 << 16


@dataclass(frozen=True, slots=True)
class SlotPolicy:
    """What one version's sequence batcher does; the control and state tensors are in :mod:`.sequence_controls`."""

    instances: int = 1
    slots: int = 1
    oldest: bool = False
    max_batch_size: int = 0
    idle_ns: int = 1_000_000_000
    max_delay_ns: int = 0
    min_utilization: float = 0.0
    preferred: tuple[int, ...] = ()
    iterative: bool = False

    @classmethod
    def from_config(cls, config: Any, instances: int) -> SlotPolicy:
        sb = config.sequence_batching
        mbs = max(int(config.max_batch_size), 0)
        common = {"instances": max(instances, 1), "max_batch_size": mbs, "iterative": bool(sb.iterative_sequence),
                  "idle_ns": int(sb.max_sequence_idle_microseconds or 1_000_000) * 1000}
        if sb.WhichOneof("strategy_choice") == "oldest":
            o = sb.oldest
            preferred = tuple(sorted({int(p) for p in o.preferred_batch_size if 0 < p <= max(mbs, 1)}))
            return cls(slots=max(int(o.max_candidate_sequences), 1), oldest=True, preferred=preferred,
                       max_delay_ns=int(o.max_queue_delay_microseconds) * 1000, **common)
        d = sb.direct
        return cls(slots=max(mbs, 1), max_delay_ns=int(d.max_queue_delay_microseconds) * 1000,
                   min_utilization=float(d.minimum_slot_utilization), **common)


@dataclass(slots=True)
class _Sequence(Generic[T]):
    corr_id: int | str
    queue: collections.deque[tuple[T, int, int]] = field(default_factory=collections.deque)  # (item, enqueued_ns, flags)
    place: tuple[int, int] | None = None  # (instance, slot) while it holds one
    last_ns: int = 0
    running: int = 0  # dispatched requests not completed yet
    ending: bool = False  # its END request was dispatched: release when it completes


class Slot(NamedTuple, Generic[T]):
    """One entry of a batch: the request (None: an empty slot of a ``direct`` batch) and its sequence id."""

    item: T | None
    corr_id: int | str
    flags: int = 0


class SequenceSlots(Generic[T]):
    """Slots, backlog and idle times of one version's sequences; see the module docstring."""

    def __init__(self, policy: SlotPolicy) -> None:
        self.policy = policy
        self._active: dict[int | str, _Sequence[T]] = {}
        self._backlog: collections.OrderedDict[int | str, _Sequence[T]] = collections.OrderedDict()
        self._slots: list[list[_Sequence[T] | None]] = [[None] * policy.slots for _ in range(policy.instances)]
        self._queued = 0
        self._closed: set[int] = set()  # instances out of the pool (not UP): no sequence is given their slots
        # no sequence can time out before this: expire() costs nothing on the hot path until then
        self._check_at = _NEVER

    def __len__(self) -> int:
        """Requests queued (not dispatched yet)."""
        return self._queued

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def ready(self, instance: int) -> bool:
        """Whether a sequence holding a slot of ``instance`` has a request queued (a batch can form there)."""
        return any(s is not None and s.queue for s in self._slots[instance])

    @property
    def free(self) -> int:
        """Slots of the instances in the pool that no sequence holds."""
        return sum(row.count(None) for i, row in enumerate(self._slots) if i not in self._closed)

    def add(self, item: T, corr_id: int | str, flags: int, now_ns: int, model: str) -> None:
        """Queue ``item`` for its sequence; raises INVALID_ARG for a sequence that never started."""
        if self._queued >= MAX_QUEUED:  # Triton's answer to a full queue (UNAVAILABLE)
            raise TritonError.unavailable("Exceeds maximum queue size")
        seq = self._active.get(corr_id) or self._backlog.get(corr_id)
        if not flags & SEQUENCE_START and (seq is None or seq.ending):
            raise TritonError.invalid_arg(
                    f"inference request for sequence {corr_id} to model '{model}' must specify the START flag "
                    "on the first request of the sequence")
        if seq is None:
            seq = _Sequence(corr_id)
            self._backlog[corr_id] = seq
        seq.queue.append((item, now_ns, flags))
        seq.last_ns = now_ns
        self._queued += 1
        self._assign()

    def requeue(self, item: T, corr_id: int | str, now_ns: int, flags: int = 0) -> None:
        """Put a rescheduled request back at the head of its (still active) sequence; in an iterative
        sequence its ``flags`` are 0, neither START nor END any more (Triton's GenerativeSequencer)."""
        seq = self._active[corr_id]
        seq.queue.appendleft((item, now_ns, flags))
        seq.last_ns = now_ns
        self._queued += 1

    def completed(self, corr_id: int | str, now_ns: int, release: bool) -> bool:
        """A dispatched request of ``corr_id`` finished; ``release`` ends the sequence (iterative final).
        Returns whether the sequence ended (its slot is free again)."""
        seq = self._active.get(corr_id)
        if seq is None:
            return True
        seq.running -= 1
        seq.last_ns = now_ns
        if seq.running == 0 and not seq.queue:
            if release or seq.ending:
                self._release(seq)
                return True
            self._check_at = min(self._check_at, now_ns + self.policy.idle_ns)  # idle from now on
        return False

    def cancel(self, corr_id: int | str) -> list[T]:
        """A dispatched request of ``corr_id`` was cancelled before it ran: the sequence ends, and its
        queued requests are returned to be cancelled too (Triton cancels the rest of the sequence)."""
        seq = self._active.get(corr_id)
        if seq is None:
            return []
        out = [entry[0] for entry in seq.queue]
        self._queued -= len(out)
        seq.queue.clear()
        seq.running -= 1
        if seq.running == 0:
            self._release(seq)
        else:
            seq.ending = True
        return out

    def take(self, instance: int, now_ns: int) -> tuple[list[Slot[T]], int | None]:
        """The batch to run on idle ``instance`` now (empty: nothing), or how long to wait for more."""
        row = self._slots[instance]
        heads = [(i, s) for i, s in enumerate(row) if s is not None and s.queue]
        if not heads:
            return [], None
        policy = self.policy
        oldest_ns = min(s.queue[0][1] for _, s in heads)
        waited = now_ns - oldest_ns
        if policy.oldest:
            heads.sort(key=lambda h: h[1].queue[0][1])
            cap = max(policy.max_batch_size, 1)
            n = min(len(heads), cap)
            fits = [p for p in policy.preferred if p <= n]
            delay = policy.max_delay_ns
            exceeded = bool(delay) and waited >= delay
            if fits and not exceeded:
                n = fits[-1]  # a preferred size reached before the delay: send that (dynamic batcher rule)
            elif not (delay == 0 or exceeded or n == cap):
                return [], delay - waited
            return [self._pop(s) for _, s in heads[:n]], None
        if policy.max_delay_ns and waited < policy.max_delay_ns and len(heads) < policy.min_utilization * len(row):
            return [], policy.max_delay_ns - waited
        ready = dict(heads)
        return [self._pop(ready[i]) if i in ready else Slot(None, 0) for i in range(heads[-1][0] + 1)], None

    def expire(self, now_ns: int) -> list[int | str]:
        """Release the sequences idle for ``idle_ns``; returns their ids (their state is discarded)."""
        if now_ns < self._check_at:
            return []
        idle = self.policy.idle_ns
        waiting = [s for s in self._active.values() if not s.queue and not s.running]
        gone = [s for s in waiting if now_ns - s.last_ns >= idle]
        for seq in gone:
            self._release(seq)
        self._check_at = min((s.last_ns + idle for s in waiting if now_ns - s.last_ns < idle), default=_NEVER)
        return [s.corr_id for s in gone]

    def next_idle_ns(self, now_ns: int) -> int | None:
        """Nanoseconds until an active sequence may time out (None: none can)."""
        return None if self._check_at == _NEVER else max(self._check_at - now_ns, 0)

    def close_instance(self, instance: int) -> tuple[list[int | str], list[T]]:
        """``instance`` left the pool: the sequences it holds end (the state the model kept for them is
        gone with it); returns their ids and their queued requests (to be failed). No new sequence gets
        its slots until :meth:`open_instance`."""
        self._closed.add(instance)
        ended: list[int | str] = []
        out: list[T] = []
        for slot, seq in enumerate(self._slots[instance]):
            if seq is None:
                continue
            ended.append(seq.corr_id)
            out += [entry[0] for entry in seq.queue]
            self._queued -= len(seq.queue)
            seq.queue.clear()
            self._slots[instance][slot] = None
            self._active.pop(seq.corr_id, None)
        self._assign()
        return ended, out

    def open_instance(self, instance: int) -> None:
        """``instance`` is back in the pool: its slots take sequences again."""
        self._closed.discard(instance)
        self._assign()

    def clear(self) -> list[T]:
        """Remove and return every queued request (shutdown)."""
        out = [entry[0] for s in (*self._active.values(), *self._backlog.values()) for entry in s.queue]
        self._active.clear()
        self._backlog.clear()
        self._slots = [[None] * self.policy.slots for _ in range(self.policy.instances)]
        self._queued = 0
        self._check_at = _NEVER
        return out

    # -- internals ----------------------------------------------------------------------------------
    def _pop(self, seq: _Sequence[T]) -> Slot[T]:
        item, _, flags = seq.queue.popleft()
        self._queued -= 1
        seq.running += 1
        seq.ending = not self.policy.iterative and bool(flags & SEQUENCE_END)
        return Slot(item, seq.corr_id, flags)

    def _release(self, seq: _Sequence[T]) -> None:
        if seq.place is not None:
            instance, slot = seq.place
            self._slots[instance][slot] = None
        self._active.pop(seq.corr_id, None)
        self._assign()

    def _assign(self) -> None:
        """Give free slots to backlog sequences, oldest first, on the least loaded instance."""
        while self._backlog:
            free = [(sum(s is not None for s in row), i, row.index(None)) for i, row in enumerate(self._slots)
                    if None in row and i not in self._closed]
            if not free:
                return
            _, instance, slot = min(free)
            corr_id, seq = self._backlog.popitem(last=False)
            seq.place = (instance, slot)
            seq.ending = False
            self._slots[instance][slot] = seq
            self._active[corr_id] = seq

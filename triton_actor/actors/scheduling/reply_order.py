"""ReplyOrder: ``preserve_ordering`` (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md), each reply released only once every request dispatched
before it is answered: dispatch order, which is arrival order (the option requires that to be unambiguous:
one priority level, no DELAY policy; batch_queue.py).

Owner: one :class:`~.scheduler.SchedulerActor`, from its handlers, and only with ``preserve_ordering``
(without it replies complete at once and nothing here runs). State: the next dispatch number, the next one
to release, the finished replies waiting for earlier ones, the number of each request while it runs (by the
``id`` of its item). Invariant: every number handed out is released once, with its reply or as a place
given up (a rescheduled request); :meth:`ReplyOrder.flush` completes whatever is held when the owner stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ReplyOrder(Generic[T]):
    """Replies held until their turn; ``complete(item, ok, value)`` answers one."""

    __slots__ = ("_complete", "_next", "_release", "_held", "_number")

    def __init__(self, complete: Callable[[T, bool, Any], None]) -> None:
        self._complete = complete
        self._next = 0  # the number of the next request dispatched
        self._release = 0  # the number whose reply goes next
        self._held: dict[int, tuple[T, bool, Any] | None] = {}  # finished, waiting (None: a place given up)
        self._number: dict[int, int] = {}  # id(item) → its number, while it runs

    def dispatched(self, items: list[T]) -> None:
        """A batch starts: its requests take the next numbers."""
        for item in items:
            self._number[id(item)] = self._next
            self._next += 1

    def finished(self, item: T, ok: bool, value: Any) -> None:
        """Its answer: completed now if every earlier one is, else held. An item answered already is left
        as it is (a batch that could not be answered answers each of its items with the error)."""
        number = self._number.pop(id(item), None)
        if number is not None:
            self._held[number] = (item, ok, value)
            self._release_due()

    def give_up(self, item: T) -> None:
        """A rescheduled request: later replies do not wait for it; it takes a new number when it runs again."""
        self._held[self._number.pop(id(item))] = None
        self._release_due()

    def flush(self) -> None:
        """The owner stops: every held reply completes, in order."""
        for number in sorted(self._held):
            entry = self._held.pop(number)
            if entry is not None:
                self._complete(*entry)

    def _release_due(self) -> None:
        held = self._held
        while self._release in held:
            entry = held.pop(self._release)
            if entry is not None:
                self._complete(*entry)
            self._release += 1

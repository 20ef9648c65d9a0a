"""The hub greenlet an instance promoted to run "in a greenlet of its own" (``ModelInstance.own``: a Python
model that calls the server, see instance.py) runs its batches in. Owner: that :class:`~.instance.ModelInstance`
(hub thread), which makes it at its first such batch and stops it when it closes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
import gevent.hub

from ...inference import InferRequest

Done = Callable[[bool, Any], None]


class OwnLoop:
    """The greenlet a ``ModelInstance.own`` instance runs its batches in (one at a time: the
    instance is taken from its pool for each), kept for the instance's life. A greenlet per batch cost a
    map and an unmap of its Python frame stack each time (``strace -c -f``), and their page faults: a BLS
    caller's request in a live server, 193 -> 167 us of server CPU with this loop alone."""

    __slots__ = ("_greenlet", "_item", "_waiter", "_hub")

    def __init__(self, instance: Any) -> None:
        self._hub = gevent.get_hub()
        self._item: tuple[list[InferRequest], Done] | None = None
        self._waiter: Any = None
        self._greenlet = gevent.spawn(self._serve, instance)

    @property
    def dead(self) -> bool:
        return self._greenlet.dead

    def give(self, requests: list[InferRequest], done: Done) -> None:
        """Hub thread: run this batch next (its greenlet takes it when it started, or at once when it waits)."""
        self._item = (requests, done)
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._hub.loop.run_callback(waiter.switch, None)

    def _serve(self, instance: Any) -> None:
        while True:
            item, self._item = self._item, None
            if item is None:
                self._waiter = gevent.hub.Waiter()
                self._waiter.get()
            else:
                instance._run_own(*item)

    def stop(self) -> None:
        self._greenlet.kill(block=False)

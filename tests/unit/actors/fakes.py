"""What the model-actor and supervision tests share: the fake backend, its model's config, its gate and a bounded wait."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
import numpy as np

from triton_actor.backends.base import InstanceContext
from triton_actor.inference import InferRequest, InferResponse
from triton_actor.runtime.threads import native_lock

WAIT = 10.0
CONFIG = """
backend: "fake"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


class Gate:
    """Holds the fake model's ``execute`` (on native instance threads: a native lock) while closed, so a
    test knows a request is in flight for as long as it needs; ``reached`` counts the runs that came to it."""

    def __init__(self) -> None:
        self._open = native_lock()  # the fake model runs on native instance threads
        self.reached = 0

    def close(self) -> None:
        self._open.acquire()

    def open(self) -> None:
        self._open.release()

    def passage(self) -> None:
        self.reached += 1
        if not self._open.acquire(timeout=WAIT):  # bounded: a failed test never opens it
            raise RuntimeError("the gate never opened")
        self._open.release()


def until(condition: Callable[[], bool], what: str) -> None:
    """Re-check ``condition`` (state a native thread or an actor changes) every 10 ms, at most ``WAIT`` s."""
    with gevent.Timeout(WAIT, AssertionError(f"timed out waiting for {what}")):
        while not condition():
            gevent.sleep(0.01)  # the wait-for helper's poll



class FakeInstance:
    """Answers every request with ``Y = [tag]`` once the backend's gate lets it through; logs its finalize."""

    inline_ok = False

    def __init__(self, tag: float, backend: FakeBackend) -> None:
        self.tag = tag
        self.events = backend.events
        self.gate = backend.gate

    def execute(self, requests: list[InferRequest]) -> list[Any]:
        self.gate.passage()
        return [InferResponse([("Y", np.array([self.tag], np.float32))]) for _ in requests]

    def finalize(self) -> None:
        self.events.append(("finalize", self.tag))


class FakeBackend:
    """A backend whose instances are :class:`FakeInstance`: tagged by ``tag(ctx, serial)`` (default: the
    serial number of the instance, 1 for the first created); a version folder holding a file ``broken``
    fails to load; the next ``bugs`` ``auto_complete`` calls raise a plain exception (a bug, not a TritonError)."""

    name = "fake"

    def __init__(self, tag: Callable[[InstanceContext, int], float] | None = None) -> None:
        self.bugs = 0
        self.created = 0
        self.events: list[tuple[str, Any]] = []
        self.gate = Gate()
        self._tag = tag or (lambda ctx, serial: float(serial))

    def auto_complete(self, *args: Any, **kw: Any) -> None:
        if self.bugs > 0:
            self.bugs -= 1
            raise RuntimeError("a bug in the backend")

    def create(self, ctx: InstanceContext) -> FakeInstance:
        if (ctx.version_dir / "broken").exists():
            raise RuntimeError("broken on purpose")
        self.created += 1
        return FakeInstance(self._tag(ctx, self.created), self)

"""What the model-actor and supervision tests share: the fake model's config, its gate and a bounded wait."""

from __future__ import annotations

from collections.abc import Callable

import gevent

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


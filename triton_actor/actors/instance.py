"""InstanceActor: one model instance = one native OS thread running one backend instance.

Its mailbox is the native thread's queue (see :mod:`.bridge`): ``execute`` queues a batch there and
the completion callback runs in the hub. State it owns: the backend instance (confined to its
thread), the device placement. Failure: a load error fails :meth:`wait_ready`; an error raised by
the backend while executing fails that batch only; the instance keeps serving.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..backends.base import Backend, BackendInstance, InstanceContext, Result
from ..errors import TritonError
from ..inference import InferRequest
from .bridge import NativeWorker

Timings = tuple[int, int, int]  # compute_input, compute_infer, compute_output (ns)
Done = Callable[[bool, Any], None]


def _run_batch(instance: BackendInstance, requests: list[InferRequest]) -> tuple[list[Result], Timings]:
    """Native thread: run one batch and time it."""
    t0 = time.perf_counter_ns()
    results = instance.execute(requests)
    t1 = time.perf_counter_ns()
    if len(results) != len(requests):
        raise TritonError.internal(f"backend returned {len(results)} results for {len(requests)} requests")
    return results, (0, t1 - t0, 0)


def _finalize(instance: BackendInstance) -> None:
    instance.finalize()


class InstanceActor:
    """Facade over one native worker: ``execute(batch, done)`` and ``close()`` (hub thread only)."""

    __slots__ = ("ctx", "_worker")

    def __init__(self, ctx: InstanceContext, backend: Backend) -> None:
        self.ctx = ctx
        self._worker: NativeWorker[BackendInstance] = NativeWorker(
            ctx.instance_name, setup=lambda: backend.create(ctx), teardown=_finalize
        )

    @property
    def name(self) -> str:
        return self.ctx.instance_name

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block the calling greenlet until the backend instance loaded; raise its load error."""
        self._worker.ready.get(timeout)

    def execute(self, requests: list[InferRequest], done: Done) -> None:
        """Queue a batch; ``done(ok, (results, timings) | error)`` runs in the hub when it finishes."""
        self._worker.submit_callback(_run_batch, (requests,), done)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Finish queued batches, ``finalize()`` the backend, join the thread."""
        return self._worker.close(timeout)

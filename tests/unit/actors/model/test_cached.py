"""The cache front of one version (actors/model/cached.py) with a fake scheduler and stores: what a hit
and a miss count, and that a blocking store's greenlet always answers its request."""

from __future__ import annotations

from typing import Any

import gevent
import numpy as np
import pytest

from triton_actor.actors.model.cached import CachedVersion
from triton_actor.cache.local import LocalCache
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.metrics.statistics import VersionStats
from triton_actor.protocol.dtypes import BY_WIRE


class _Ref:
    """Answers at once: a response, a failed reply (an error), or a refused tell (``refuses``)."""

    def __init__(self, answer: Any, refuses: bool) -> None:
        self.answer, self.refuses, self.told = answer, refuses, 0

    def tell(self, msg: Any) -> None:
        self.told += 1
        if self.refuses:
            raise self.answer
        if isinstance(self.answer, TritonError):
            msg.reply.fail(self.answer)
        else:
            msg.reply.set(self.answer)


class _Scheduler:
    def __init__(self, answer: Any, refuses: bool = False) -> None:
        self.ref = _Ref(answer, refuses)


class _BlockingLocal(LocalCache):
    blocking = True  # as redis: looked up in a greenlet of its own


class _Broken(LocalCache):
    blocking = True

    def lookup(self, key: bytes) -> Any:
        raise RuntimeError("bug")


def _request(value: float) -> InferRequest:
    data = np.full(4, value, np.float32)
    return InferRequest("m", -1, "", {"IN": InferInput("IN", BY_WIRE["FP32"], (4,), data)})


def _front(store: Any, answer: Any, refuses: bool = False) -> tuple[CachedVersion, VersionStats, _Scheduler]:
    stats, scheduler = VersionStats("m", 1), _Scheduler(answer, refuses)
    return CachedVersion(store, stats, "m", 1, scheduler), stats, scheduler


@pytest.mark.parametrize("store", [LocalCache(1 << 20), _BlockingLocal(1 << 20)])
def test_a_miss_runs_and_is_kept_a_hit_does_not_run(store: Any) -> None:
    out = InferResponse([("OUT", np.arange(4, dtype=np.float32))])
    front, stats, scheduler = _front(store, out)
    first = front.infer(_request(1), 0).get(timeout=10)
    assert first is out and scheduler.ref.told == 1
    gevent.idle()  # the reply's callbacks (the insertion) ran
    snap = stats.snapshot()["durations"]
    assert snap["cache_miss"][0] == 1 and snap["cache_hit"][0] == 0
    second = front.infer(_request(1), 0).get(timeout=10)
    np.testing.assert_array_equal(second.outputs[0][1], out.outputs[0][1])
    assert second is not out and scheduler.ref.told == 1
    snap = stats.snapshot()
    assert snap["durations"]["cache_hit"][0] == 1 and snap["durations"]["success"][0] == 1  # the miss's success is the scheduler's
    assert (snap["inference_count"], snap["execution_count"], snap["cache_enabled"]) == (0, 0, True)


def test_a_failed_answer_is_not_kept() -> None:
    store = LocalCache(1 << 20)
    front, stats, _ = _front(store, TritonError.internal("model failed"))
    with pytest.raises(TritonError):
        front.infer(_request(2), 0).get(timeout=10)
    gevent.idle()
    assert len(store) == 0 and stats.snapshot()["durations"]["cache_miss"][0] == 0
    front, _, _ = _front(store, TritonError.unavailable("unloading"), refuses=True)
    with pytest.raises(TritonError):
        front.infer(_request(2), 0)  # the local path raises in the caller, as VersionHandle.infer does


def test_a_blocking_store_answers_every_request_whatever_fails() -> None:
    refused = TritonError.unavailable("unloading")
    front, _, _ = _front(_BlockingLocal(1 << 20), refused, refuses=True)
    with pytest.raises(TritonError) as e:
        front.infer(_request(3), 0).get(timeout=10)
    assert e.value is refused
    front, _, _ = _front(_Broken(1 << 20), InferResponse([]))
    with pytest.raises(TritonError) as e:
        front.infer(_request(3), 0).get(timeout=10)
    assert "response cache" in e.value.message


class _Holding:
    """A scheduler that queues and never runs: what it was told is kept."""

    def __init__(self) -> None:
        self.ref = self
        self.queued: list[Any] = []

    def tell(self, msg: Any) -> None:
        self.queued.append(msg)


def test_a_blocking_store_answers_after_storing_and_passes_a_cancel_on() -> None:
    store, scheduler = _BlockingLocal(1 << 20), _Holding()
    front = CachedVersion(store, VersionStats("m", 1), "m", 1, scheduler)
    reply = front.infer(_request(4), 0)
    gevent.idle()  # the lookup greenlet queued it
    (queued,) = scheduler.queued
    queued.reply.set(InferResponse([("OUT", np.zeros(2, np.float32))]))
    reply.get(timeout=10)
    assert len(store) == 1  # kept before the client got its answer
    cancelled = front.infer(_request(5), 0)
    gevent.idle()
    cancelled.fail(TritonError(Code.CANCELLED, "request cancelled by the client"))  # as the front ends do
    gevent.idle()  # the reply's callbacks ran
    assert scheduler.queued[-1].reply.ready()  # the scheduler sees the cancel: a queued request is not run

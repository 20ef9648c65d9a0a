#!/usr/bin/env python3
"""The scheduler's own cost per request: Enqueue → run on an idle instance → BatchDone → answer, with two
fake instances that answer at once (no model, no thread, no front end). Prints the best of ``--rounds``
rounds of ``--n`` requests; run it against another checkout with ``PYTHONPATH`` to compare.

    PYTHONPATH=. .venv/bin/python scripts/bench_scheduler.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from triton_actor import bootstrap  # noqa: F401  (gevent patching first)
from triton_actor.actors.scheduling.scheduler import Enqueue, SchedulerActor
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.metrics.statistics import VersionStats
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime.kernel import Reply


class _Instant:
    """A ModelInstance stand-in that answers every batch at once, in the caller."""

    observes_cancellation = False
    inline = False  # True: counted per hub turn, and this loop, one turn, would start 64 a turn (actors/scheduling/pool_scheduler.py)
    health, reason = "UP", ""

    def __init__(self, name: str) -> None:
        self.name = name

    def watch(self, watcher: Any) -> None:
        pass

    def execute(self, requests: list[InferRequest], done: Any) -> None:
        done(True, ([InferResponse([], {}) for _ in requests], (0, 0, 0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sched = SchedulerActor("scheduler:m:1", [_Instant("m_0"), _Instant("m_1")], VersionStats("m", 1))  # type: ignore[list-item]
    sched.start()
    x = InferInput("X", BY_WIRE["FP32"], (1,), np.zeros(1, np.float32))
    request = InferRequest("m", 1, "", {"X": x})
    best = float("inf")
    for _ in range(args.rounds):
        start = time.perf_counter_ns()
        for _ in range(args.n):
            reply: Reply = Reply()
            sched.ref.tell(Enqueue(request, 1, reply, 0))
        reply.get(timeout=60)  # the last answer: with fast paths off, tell only queues in the mailbox
        best = min(best, (time.perf_counter_ns() - start) / args.n)
    sched.stop()
    print(f"scheduler round trip: {best / 1000:.2f} µs per request (best of {args.rounds} x {args.n})")


if __name__ == "__main__":
    main()

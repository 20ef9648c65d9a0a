"""What the host's resource units (``--rate-limit`` with ``--workers``, workers/resources.py) add per execution.

Runs the rate limiter's cycle of one execution (an instance asks, is granted, gives back) N times in this
process, without shared units (one process: what every execution paid before) and with a worker's
``HostUnits`` on a temporary run directory, for one global resource; prints CPU nanoseconds per cycle
(process CPU time, not wall clock, so other load on the machine counts less).

    .venv/bin/python scripts/bench_rate_limiter_units.py [N]
"""

from __future__ import annotations

import sys
import tempfile
import time

from triton_actor.actors.scheduling.rate_limiter import GLOBAL, Needs, RateLimiter
from triton_actor.workers.resources import HostUnits


def cycle_ns(limiter: RateLimiter, n: int) -> float:
    [waiter] = limiter.register([(Needs(((("R", GLOBAL), 1),)), "m_0")])
    never = lambda: None  # noqa: E731 - the grant is immediate: nobody else holds R
    for _ in range(1000):  # warm
        limiter.ask(waiter, never)
        limiter.give_back(waiter)
    started = time.process_time_ns()
    for _ in range(n):
        assert limiter.ask(waiter, never)
        limiter.give_back(waiter)
    return (time.process_time_ns() - started) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    alone = cycle_ns(RateLimiter(), n)
    with tempfile.TemporaryDirectory() as run_dir:
        shared = cycle_ns(RateLimiter(shared=HostUnits(run_dir)), n)
    print(f"one process:   {alone:8.0f} ns CPU per execution (ask + give back)")
    print(f"host's units:  {shared:8.0f} ns CPU per execution (+{shared - alone:.0f} ns: 4 lock calls)")


if __name__ == "__main__":
    main()

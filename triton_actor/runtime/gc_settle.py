"""The cyclic garbage collector kept off the request path: after models load or unload, collect once and
move every object then alive into the permanent generation (``gc.freeze``).

Why: the server process holds about 200,000 long-lived objects once torch and onnxruntime are imported
(modules, functions, a model's graph), and CPython's full (generation 2) collection walks all of them:
73-85 ms on the 2-core machine here, with the hub, and every client on it, stopped for that time. Such a
collection comes whenever the objects that survived younger collections reach a quarter of the old ones,
so under traffic it came every few seconds, a pause in the p99 of every request. Frozen objects are not
walked: a full collection after :func:`settle` took 0.0 ms in the same process.

What it costs: one collection at each settle (the same 80 ms, once, after a load, not during traffic);
and an object frozen is never collected while frozen, so a model unloaded later could leave its reference
cycles behind. Hence each settle first unfreezes (those cycles are collected then) and freezes again, and
one comes at least every :data:`PERIOD_S` (objects of the last settle that became cyclic garbage since).
Loads and unloads come in bursts (a repository load, POLL), so :func:`soon` runs one settle
:data:`DELAY_S` after the last change. Children forked later (gunicorn's workers fork before loading)
share frozen pages instead of dirtying them in their collections (the ``gc.freeze`` docs' reason).

A fast path: ``TRITON_ACTOR_FAST_PATHS=0`` (or ``--fast-paths=false``) leaves CPython's collector as it is.
Owner: this module, in the hub thread (the one pending settle).
"""

from __future__ import annotations

import gc
import logging
import time

import gevent

from . import fastpath

log = logging.getLogger(__name__)

DELAY_S = 1.0  # after the last load or unload of a burst
PERIOD_S = 600.0  # and at least this often: objects frozen at a settle that became cyclic garbage since go then
_pending: gevent.Greenlet | None = None
settles = 0  # done in this process (tests and /status.json read it); soon() waits for the first (a server's)


def settle() -> None:
    """Collect, then freeze what is alive (hub thread). A no-op with fast paths off."""
    global settles
    if not fastpath.enabled:
        return
    started = time.perf_counter()
    gc.unfreeze()  # what was frozen and has become garbage since (an unloaded model's cycles) is collected now
    gc.collect()
    gc.freeze()
    settles += 1
    _schedule(PERIOD_S)  # the next one, unless a change comes sooner
    log.debug("gc settled: %d objects frozen in %.1f ms", gc.get_freeze_count(), (time.perf_counter() - started) * 1e3)


def status() -> dict[str, int]:
    """For ``/status.json``: objects frozen now, settles done, full collections the collector ran."""
    return {"frozen": gc.get_freeze_count(), "settles": settles, "collections": gc.get_stats()[2]["collections"]}


def soon() -> None:
    """A model changed (hub thread): settle once the burst of changes is over. Only in a process whose
    server settled once already (a repository actor in a unit test's process leaves its collector alone)."""
    if fastpath.enabled and settles:
        _schedule(DELAY_S)


def _schedule(delay: float) -> None:
    global _pending
    if _pending is not None and _pending is not gevent.getcurrent():
        _pending.kill(block=False)  # the one planned before: this one covers it
    _pending = gevent.spawn_later(delay, _run)


def _run() -> None:
    settle()

"""ModelInstance: one model instance = one native OS thread running one backend instance.

Not an actor (see the vocabulary in :mod:`...runtime.kernel`): a **single-owner hub object**. It has no mailbox
or loop of ours; its one owner (the scheduler of its version, and the version's start/stop code before
and after that) calls ``execute`` and ``close`` from the hub thread, and the queue of its
:class:`~...runtime.bridge.NativeWorker` plays the mailbox: ``execute`` queues a batch there and the completion
callback runs in the hub. State it owns: the backend instance, its placement, and its execution mode.
Failure: a load error fails :meth:`wait_ready`; an error raised by the backend while executing fails
that batch only; the instance keeps serving. A thread whose loop fails (a bug, not a model error:
see :meth:`NativeWorker._next_item` for what a model can throw at it) answers its work UNAVAILABLE and
is replaced by a new one with a fresh backend instance, within a restart budget.

Health (what its owner is told, :meth:`watch`): :data:`UP`, :data:`RESTARTING` (its thread died and a new
one loads, or its backend instance lost what it runs on and revives it: a process-isolated model whose
process died) or :data:`DOWN` (past the restart budget, a restart that failed to load, or a backend
instance that gave up: for good, until the model is loaded again). The scheduler keeps only UP
instances in its pool and tells the model actor when none is left; the instance never touches the
version's record (Triton: ``TRITONBACKEND_ModelInstanceReady`` says the same to the model's readiness).

Execution mode (a deliberate refinement of thread-per-instance, measured in ``scripts/bench_http.py``):
handing a batch to a native thread and back costs two thread wake-ups (15-20 µs each on our 2-core
machines, and the woken thread runs cold caches), which is more than a small Python model's whole
``execute``. A backend instance that allows it (``inline_ok``: a Python model on CPU with a plain,
non-decoupled ``execute``; see ``backends/python/backend.py``, no parameter needed) is *promoted* to
run in the calling greenlet after ``PROMOTE_STREAK`` consecutive executions that used less than
``PROMOTE_NS`` of CPU time, unless code on its thread ever created a gevent hub there (it started a
thread, slept, or waited on a patched lock: it may own objects that only that hub can wake, and
waiting on them from the main hub would deadlock; :attr:`NativeWorker.used_hub`). ``DEMOTE_AFTER``
inline executions in a row using more than ``DEMOTE_NS`` of CPU time (or ``DEMOTE_WALL_NS`` of wall
time), or one far over it, demote it back to its thread, and the streak it needs next time doubles
(until ``FORGIVE_AFTER`` good inline runs reset it). So the hub is never blocked for long,
GIL-releasing or slow models keep their thread (and run in parallel), and tiny models skip the
crossings. A fast path: with :mod:`triton_actor.runtime.fastpath` off, every batch goes to the thread.

A model that calls the server (BLS, model control; ``NativeWorker.calls_server``, seen on its thread) is
promoted by the same rule to run each batch in a hub greenlet *of its own* (:attr:`own`), holding nobody's
scheduler while its calls wait there cooperatively (:class:`~...runtime.bridge.InlineRun`, which see);
a first call in a plain inline run raises :class:`~...runtime.bridge.RunOnThread` (the batch runs again on
its thread, once in its life).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent

from ...backends.base import Backend, BackendInstance, InstanceContext, Result
from ...errors import Code, TritonError
from ...inference import InferRequest
from ...runtime import fastpath
from ...runtime.bridge import (
    SERVER_CALL,
    InlineRun,
    NativeWorker,
    RunOnThread,
    contained,
    enter_inline_run,
    leave_inline_run,
)
from ...runtime.supervisor import RestartBudget
from .own_loop import OwnLoop

log = logging.getLogger(__name__)
Timings = tuple[int, int, int]  # compute_input, compute_infer, compute_output (ns)
Done = Callable[[bool, Any], None]
Watcher = Callable[["ModelInstance", str, str], None]  # (instance, health, reason), called in the hub
UP, RESTARTING, DOWN = "UP", "RESTARTING", "DOWN"  # ModelInstance.health

PROMOTE_NS = 200_000
PROMOTE_STREAK = 32
DEMOTE_NS = 1_000_000
DEMOTE_WALL_NS = 20_000_000
DEMOTE_AFTER = 3  # slow inline runs in a row
DEMOTE_AT_ONCE_NS = 10_000_000  # CPU time of one inline run that demotes by itself
DEMOTE_AT_ONCE_WALL_NS = 50_000_000
FORGIVE_AFTER = 4096  # inline runs without a demotion that reset the promotion streak
NEVER = 1 << 62  # a streak no instance reaches: promotion is off for good
CLOCKED_RUNS = FORGIVE_AFTER  # inline runs timed by the thread's CPU clock after a long one
_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns


def _run_batch(instance: BackendInstance, requests: list[InferRequest]) -> tuple[list[Result], Timings]:
    """Run one batch and time it (native thread, or the calling greenlet when inline)."""
    t0 = _perf_ns()
    results = instance.execute(requests)
    t1 = _perf_ns()
    if len(results) != len(requests):
        raise TritonError.internal(f"backend returned {len(results)} results for {len(requests)} requests")
    return results, (0, t1 - t0, 0)


def _run_batch_cpu(instance: BackendInstance, requests: list[InferRequest]) -> tuple[Any, int]:
    """Native thread: like :func:`_run_batch`, plus the CPU time the thread spent. Promotion looks at
    CPU time, not wall time: under load the wall time includes waiting for the GIL."""
    c0 = _thread_ns()
    value = _run_batch(instance, requests)
    return value, _thread_ns() - c0


def _finalize(instance: BackendInstance) -> None:
    instance.finalize()


def _revive(instance: Any) -> tuple[str, str]:
    """Native thread: let a backend instance that lost its process start a new one; its health after."""
    instance.revive()
    return instance.health


def _text(error: object) -> str:
    return error.message if isinstance(error, TritonError) else repr(error)


class ModelInstance:
    """One backend instance on its native worker: ``execute(batch, done)`` and ``close()``; a
    single-owner hub object, not an actor (hub thread only, never blocks the caller)."""

    __slots__ = ("ctx", "_worker", "_backend", "_backend_instance", "inline", "own", "_own_loop", "_streak", "_needed", "_hub", "_slow",
                 "_clock", "_closing", "_restarts", "health", "reason", "_watcher", "_reviving",
                 "observes_cancellation", "watches_cancellation")

    def __init__(self, ctx: InstanceContext, backend: Backend) -> None:
        self.ctx = ctx
        self._backend = backend
        self._backend_instance: BackendInstance | None = None
        # whether the backend instance reads ``InferRequest.is_cancelled`` while it runs, and whether it must
        # be told of a cancellation (``bridge.CancelWatch``) rather than poll the probe: set with it
        self.observes_cancellation = self.watches_cancellation = False
        # whether batches run on the caller's stack (promoted); read by the schedulers for every batch, a
        # plain attribute (a property was a frame per read, twice per direct run)
        self.inline = False
        self.own = False  # promoted, and its model calls the server: each batch in a hub greenlet of its own
        self._own_loop: OwnLoop | None = None  # that greenlet (made at the first such batch)
        self._streak = 0
        self._needed = PROMOTE_STREAK
        self._slow = 0  # slow inline runs in a row
        self._clock = 0  # inline runs still to clock (CLOCKED_RUNS after a long one)
        self._hub = gevent.get_hub()
        self._closing = False
        self._restarts = RestartBudget()
        self.health, self.reason = UP, ""  # read by the owner; changed only by _set_health
        self._watcher: Watcher | None = None
        self._reviving = False  # a revive() of the backend instance is queued on the thread
        self._worker: NativeWorker[BackendInstance] = self._start_worker()

    def _start_worker(self) -> NativeWorker[BackendInstance]:
        worker: NativeWorker[BackendInstance] = NativeWorker(
            self.ctx.instance_name, setup=self._create_in_thread(self._backend), teardown=_finalize)
        worker.tag = (self.ctx.model_name, self.ctx.version)  # the BLS wait graph counts instances by it
        worker.stopped.link(self._on_stopped)
        return worker

    def _on_stopped(self, stopped: Any) -> None:
        """Hub: the worker's thread ended. Closed by us, or a failed first load: nothing to do. A failed
        restart: the instance is DOWN. Its loop failed (``NativeWorker.died``; the work it held was
        answered UNAVAILABLE): a new thread with a fresh backend instance takes over (RESTARTING, then UP
        once loaded), as Triton restarts a Python stub that died, within the restart budget of
        :mod:`...runtime.supervisor`; past it the instance is DOWN and answers UNAVAILABLE."""
        died = self._worker.died
        if self._closing or stopped is not self._worker.stopped:
            return
        self.inline = self.own = False  # its backend instance was finalized with the thread: never run it inline again
        if died is None:  # a restart whose load failed (a first load that fails is wait_ready's error)
            if self.health == RESTARTING:
                error = self._worker.ready.exception()
                self._set_health(DOWN, f"instance '{self.name}' failed to restart: {_text(error)}; load the model again")
            return
        if not self._restarts.allow(self.name):
            log.error("instance %s stopped again (%r): past its restart budget, it stays down", self.name, died)
            self._set_health(DOWN, f"instance '{self.name}' stopped {self._restarts.max_restarts + 1} times within "
                                   f"{self._restarts.window_s:.0f} s (the last: {_text(died)}); load the model again")
            return
        log.warning("instance %s stopped unexpectedly (%r): starting it again", self.name, died)
        self._streak, self._backend_instance = 0, None
        self._set_health(RESTARTING, f"instance '{self.name}' stopped unexpectedly: {_text(died)}")
        self._worker = self._start_worker()
        self._worker.ready.link(self._on_restarted)

    def _on_restarted(self, ready: Any) -> None:
        """Hub: a restarted thread loaded its backend instance (a failure ends up in :meth:`_on_stopped`)."""
        if ready.exception() is None and ready is self._worker.ready and not self._closing:
            log.info("instance %s is serving again", self.name)
            self._set_health(UP, "")

    def watch(self, watcher: Watcher | None) -> None:
        """Hub: ``watcher(instance, health, reason)`` is called on every change of :attr:`health` (the
        owner's, one at a time: the scheduler that holds this instance in its pool)."""
        self._watcher = watcher

    def _set_health(self, health: str, reason: str) -> None:
        if self.health == DOWN or (health == self.health and reason == self.reason):
            return  # DOWN is for good: a later event of a dead thread or backend changes nothing
        self.health, self.reason = health, reason
        if self._watcher is not None:
            self._watcher(self, health, reason)

    def _checked(self, done: Done) -> Done:
        """Wrap a thread-mode completion of a backend instance that reports its health (``health``,
        e.g. a process-isolated Python model): after a failed batch, look whether it lost its process
        (RESTARTING: ``revive()`` on the thread starts a new one now, not at the next batch) or gave up (DOWN)."""

        def checked(ok: bool, value: Any) -> None:
            if not ok or any(isinstance(r, BaseException) for r in value[0]):
                self._look_at_backend()  # first: out of the pool before the batch's answer returns it there
            done(ok, value)

        return checked

    def _look_at_backend(self) -> None:
        """Hub: read the backend instance's health (a hint: a plain read of state its thread owns;
        :func:`_revive` looks again on the thread)."""
        backend_instance = self._backend_instance
        if backend_instance is None or self._reviving or self._closing or self.health == DOWN:
            return
        health, reason = backend_instance.health
        if health == "restart":
            self._reviving = True
            self._set_health(RESTARTING, reason)
            worker = self._worker
            self._worker.submit_callback(_revive, (), lambda ok, value: self._revived(worker, ok, value))
        elif health == "down":
            self._set_health(DOWN, reason)

    def _revived(self, worker: Any, ok: bool, value: Any) -> None:
        self._reviving = False
        if worker is not self._worker or worker.died is not None:
            return  # its thread's loop died with the revive queued (answered UNAVAILABLE): _on_stopped restarts it
        if not ok:
            self._set_health(DOWN, f"instance '{self.name}' could not be revived: {_text(value)}")
            return
        health, reason = value
        if health == "restart" and not self._restarts.allow(self.name):
            # a process that dies again right after it started, with no batch in between: the restart
            # budget bounds that loop (crashes on requests do not count: a client sending a poison input
            # must not take the instance down for everyone)
            health, reason = "down", f"{reason} (again and again after it started); load the model again"
        self._set_health(UP if health == "up" else DOWN if health == "down" else RESTARTING, reason)
        if health == "restart":  # died again meanwhile: another round
            self._look_at_backend()

    def _create_in_thread(self, backend: Backend) -> Callable[[], BackendInstance]:
        def create() -> BackendInstance:
            instance = backend.create(self.ctx)
            # the backend's answers, kept as attributes: read for every batch (a property's getattr was a
            # Python call on each direct run)
            self.observes_cancellation = getattr(instance, "observes_cancellation", False)
            self.watches_cancellation = getattr(instance, "watches_cancellation", False)
            self._backend_instance = instance  # read by the hub only after ``ready`` completes
            return instance

        return create

    @property
    def name(self) -> str:
        return self.ctx.instance_name

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block the calling greenlet until the backend instance loaded; raise its load error."""
        self._worker.ready.get(timeout)

    def execute(self, requests: list[InferRequest], done: Done) -> None:
        """Run a batch; ``done(ok, (results, timings) | error)`` is called in the hub or the caller."""
        if not self.inline:
            backend_instance = self._backend_instance
            if getattr(backend_instance, "inline_ok", False):
                if self.own:
                    loop = self._own_loop
                    if loop is None or loop.dead:
                        loop = self._own_loop = OwnLoop(self)
                    loop.give(requests, done)
                    return
                self._worker.submit_callback(_run_batch_cpu, (requests,), self._observe(done))
            else:
                if hasattr(backend_instance, "health"):
                    done = self._checked(done)
                self._worker.submit_callback(_run_batch, (requests,), done)
        elif gevent.getcurrent() is self._hub:
            gevent.spawn(self._run_inline, requests, done)  # user code may yield: never run it on the hub
        else:
            self._run_inline(requests, done)

    def _run_inline(self, requests: list[InferRequest], done: Done) -> None:
        value = self.run_here(requests, done)
        if value is not None:
            done(True, value)

    def run_here(self, requests: list[InferRequest], done: Done) -> tuple[list[Result], Timings] | None:
        """The inline run of :meth:`execute` for a caller that is not the hub and found :attr:`inline`
        true: the batch runs on the caller's stack and its ``(results, timings)`` come back; None when
        ``done`` got the batch instead (a failed inline run goes to the thread, or the run was
        interrupted), which answers it as :meth:`execute` would. The scheduler's direct run calls this."""
        assert self._backend_instance is not None
        c0 = _thread_ns() if self._clock else -1
        try:
            value = _run_batch(self._backend_instance, requests)
        except Exception:  # noqa: BLE001 - retried on the thread, whose answer counts
            self._retry_on_thread(requests, done)
            return None
        except RunOnThread as e:
            if e.args == (SERVER_CALL,):
                # the model called the server (BLS, model control) on someone's stack, which that call
                # would hold: the batch runs on the thread, where the call is recorded (promoted again, it
                # runs in a greenlet of its own)
                self.inline, self._streak = False, 0
                log.info("instance %s calls the server from execute(): it goes back to its thread", self.name)
                self._worker.submit_callback(_run_batch_cpu, (requests,), self._observe(done))
            else:  # it needs its thread (a response sender): there for good
                self.inline, self._needed = False, NEVER
                log.info("instance %s needs its thread in execute(): it keeps its thread", self.name)
                self._worker.submit_callback(_run_batch, (requests,), done)
            return None
        except (gevent.GreenletExit, gevent.Timeout):
            # killed while the model yielded: the batch must still be answered, or the instance
            # would stay busy and its replies never complete
            self.inline = False
            done(False, TritonError(Code.CANCELLED, f"instance '{self.name}': execution was interrupted"))
            raise
        except BaseException:  # noqa: BLE001 - the model's own (a BaseException subclass of its own)
            # raised on, it would end this greenlet without an answer (or, as SystemExit, the server):
            # the thread's run gives the batch its answer, as for any exception
            self._retry_on_thread(requests, done)
            return None
        for result in value[0]:  # a loop, not any() over a generator: this runs for every inline batch
            if isinstance(result, BaseException):
                self._retry_on_thread(requests, done)
                return None
        wall_ns = value[1][1]
        # a thread's CPU time never runs ahead of the wall clock: a run shorter than DEMOTE_NS of wall time
        # was short by CPU too (the few µs of this method around the run are nothing against the 1 ms
        # bound). The thread's CPU clock is a syscall that costs more than the rest of this method (0.7 µs
        # idle, 1.1-1.5 µs on the loaded 2-core host; reading it around every run cost 3-4 µs of CPU per
        # ensemble step, two reads a run): it is read only around the CLOCKED_RUNS runs after a long one.
        # A long run not clocked counts as slow by its wall time, but never demotes at once by itself; the
        # long runs after it within CLOCKED_RUNS are clocked, so a model whose long runs alternate with
        # short ones is demoted at its second (a clock switched off by the next short run never saw one).
        if wall_ns <= DEMOTE_NS:  # _after_inline_run's short run, without the call: the usual case
            if self._clock:
                self._clock -= 1
            self._slow = 0
            self._streak += 1
            if self._streak == FORGIVE_AFTER and self._needed < NEVER:
                self._needed = PROMOTE_STREAK
        else:
            self._clock = CLOCKED_RUNS
            self._after_inline_run(wall_ns if c0 < 0 else _thread_ns() - c0, wall_ns, c0 >= 0)
        return value

    def _run_own(self, requests: list[InferRequest], done: Done) -> None:
        """Hub greenlet of its own (:attr:`own`): the batch of a model that calls the server, answered
        through ``done`` as its thread's run would be. Its calls are served here (:class:`InlineRun`); a
        run that made one is not run again on the thread: its error is the answer, as on the thread."""
        backend_instance, worker = self._backend_instance, self._worker
        if backend_instance is None:  # its thread died since: the thread's answer (UNAVAILABLE)
            worker.submit_callback(_run_batch, (requests,), done)
            return
        run = InlineRun(worker)
        greenlet = enter_inline_run(run)
        worker.busy = True  # for the BLS wait graph, as while its thread runs a batch
        c0, w0 = _thread_ns(), _perf_ns()
        try:
            try:
                value = _run_batch(backend_instance, requests)
            finally:  # before the answer: the next batch may come at once
                worker.busy = False
                leave_inline_run(greenlet)
        except RunOnThread:  # a call it cannot make here (async_exec on the hub): its thread, for good
            self.own, self._needed = False, NEVER  # (kept promoted, each such batch failed again)
            log.info("instance %s makes calls to the server that need its thread: it keeps its thread", self.name)
            if run.calls:  # not run again: its calls so far would be made twice
                done(False, TritonError.internal(
                    f"instance '{self.name}': execute() made a call that needs its thread after calls served inline"))
                return
            worker.submit_callback(_run_batch, (requests,), done)
            return
        except (gevent.GreenletExit, gevent.Timeout):
            self.own = False
            done(False, TritonError(Code.CANCELLED, f"instance '{self.name}': execution was interrupted"))
            raise
        except BaseException as e:  # noqa: BLE001 - the model's own: as the thread answers it
            if not run.calls:
                self._retry_on_thread(requests, done, own=True)
            else:
                done(False, contained(e, f"instance '{self.name}' failed"))
            return
        if not run.calls:
            for result in value[0]:
                if isinstance(result, BaseException):
                    self._retry_on_thread(requests, done, own=True)
                    return
        self._after_inline_run(_thread_ns() - c0 - run.waited_cpu, _perf_ns() - w0 - run.waited_wall)
        done(True, value)

    def _after_inline_run(self, cpu_ns: int, wall_ns: int, clocked: bool = True) -> None:
        """Demote a model whose inline runs block the hub. CPU time says how long the hub was blocked;
        a long wall time with little CPU means the model yielded (a patched sleep) or the OS preempted
        us. One run far over the limit demotes at once; otherwise it takes ``DEMOTE_AFTER`` slow runs
        in a row, so a garbage collection or a preemption on a busy host does not (measured: single
        outliers under perf_analyzer on 2 cores demoted add_sub again and again, and the doubling
        streak then kept it on its thread for good). Each demotion doubles the streak the next
        promotion needs; ``FORGIVE_AFTER`` inline runs without one bring it back to the start. A run
        not ``clocked`` (``cpu_ns`` is its wall time) demotes at once only by the wall time bound."""
        if cpu_ns > DEMOTE_NS or wall_ns > DEMOTE_WALL_NS:
            self._slow += 1
            if (self._slow >= DEMOTE_AFTER or (clocked and cpu_ns > DEMOTE_AT_ONCE_NS)
                    or wall_ns > DEMOTE_AT_ONCE_WALL_NS):
                self.inline = self.own = False
                self._streak = self._slow = 0
                self._needed = min(self._needed * 2, NEVER)
                log.debug("instance %s: back to its thread (next promotion after %d short runs)", self.name, self._needed)
            return
        self._slow = 0
        self._streak += 1  # inline runs since the promotion
        if self._streak == FORGIVE_AFTER and self._needed < NEVER:
            self._needed = PROMOTE_STREAK

    def _retry_on_thread(self, requests: list[InferRequest], done: Done, own: bool = False) -> None:
        """An inline run failed: run the batch again on the instance's thread, whose answer is the one
        the clients get. A model that fails inline but not on its thread depends on its thread (a
        ``threading.local`` set in ``initialize()``, per-thread library state): it is never promoted
        again. One that fails on its thread too failed for its own reasons (a bad request): it goes
        back inline with no penalty, so clients sending bad requests cannot push a model off the fast
        path for good. The price: a failing batch of a promoted model runs twice. ``own``: the run was in a
        greenlet of its own (and made no call to the server), the mode it goes back to."""
        self.inline = self.own = False
        self._streak = 0

        def retried(ok: bool, value: Any) -> None:
            if ok:
                value, _cpu_ns = value
            if ok and not any(isinstance(r, BaseException) for r in value[0]):
                self._needed = NEVER
                log.warning("instance %s fails when run inline but not on its thread: it keeps its thread", self.name)
            elif own:
                self.own = fastpath.enabled  # the model's own error, inline or not
            else:
                self.inline = fastpath.enabled
            done(ok, value)

        self._worker.submit_callback(_run_batch_cpu, (requests,), retried)

    def _observe(self, done: Done) -> Done:
        """Wrap a thread-mode completion: count executions with little CPU time towards promotion."""

        def observed(ok: bool, value: Any) -> None:
            if ok:
                value, cpu_ns = value
                worker = self._worker
                if cpu_ns < PROMOTE_NS and not worker.used_hub and fastpath.enabled:
                    self._streak += 1
                    if self._streak >= self._needed and not getattr(self._backend_instance, "inline_ok", False):
                        self._streak = 0  # it asked for its thread meanwhile (a response sender)
                    elif self._streak >= self._needed:
                        if worker.calls_server:  # its calls must hold nobody: a greenlet of its own
                            self.own = True
                        else:
                            self.inline = True
                        self._streak = self._slow = 0
                        log.debug("instance %s: runs inline from now on%s", self.name,
                                  " (a greenlet of its own: it calls the server)" if worker.calls_server else "")
                else:
                    self._streak = 0
            else:
                self._streak = 0
            done(ok, value)

        return observed

    def close(self, timeout: float | None = 30.0) -> bool:
        """Finish queued batches, ``finalize()`` the backend on its thread, join the thread."""
        self._closing = True
        self.inline = self.own = False
        if self._own_loop is not None:
            self._own_loop.stop()
        return self._worker.close(timeout)


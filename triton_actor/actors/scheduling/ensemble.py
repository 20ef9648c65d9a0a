"""EnsembleScheduler: runs the requests of one ensemble version through its graph (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/ensemble_models.md).

An :class:`InlineActor` in the place a version's SchedulerActor takes for other models (the routing
table's :class:`~..model.handles.VersionHandle` tells it :class:`~.scheduler.Enqueue` the same way). Messages:
``Enqueue`` (a request), :class:`_StepAnswered` (a composing model answered a step, from the hub),
:class:`_StepStreamed` (one response of a decoupled composing model, from the step's reader greenlet),
``GetStats`` and ``GetStatus`` (asks), ``Drain`` (completed once no request is in flight),
:class:`~...runtime.wake_timer.Wake` (the next hub turn: start more of the steps that wait).
State owned: the requests in flight (:class:`_Run`, each with its tensor tables) and the ensemble's
:class:`~...metrics.statistics.VersionStats`. Composing models are not owned: each step is routed through the
repository's routing table when it starts (``routes()``), so it goes through that model's own scheduler
(its dynamic batcher sees ensemble traffic) and a reloaded composing model is picked up by the next step.

Data flow: a step starts as soon as every tensor it reads exists, so independent branches run at the
same time; tensors pass between steps as the same numpy arrays (no copies; a batch of 1 put in front or
taken off where one side batches and the other does not, as Triton does); a chain of steps runs as a loop
(``ensemble_chain.py``). A new tensor looks only at the steps that read it (``Graph.consumers``), and at
most :data:`STEPS_PER_TURN` steps start in one hub turn, the rest (of every request, in order) in the next
turns: a very wide ensemble (2000 steps reading its input) does not hold the hub for the whole fan-out. A
failing step fails its request with the step's message. A decoupled composing model's responses each fork
the request's tensor table and drive the steps downstream once per response; every table that completes
the ensemble outputs is one response of a decoupled ensemble. ``max_inflight_requests`` bounds the forks
of one decoupled step in flight per request: its reader stops reading until forks finish, and the step's
:class:`~...runtime.response_channel.BoundedResponseChannel` then makes the producing model's thread wait
(https://github.com/triton-inference-server/server/pull/8458), as the ensemble's client's stream bound does.
Stopping the actor fails what is in flight with UNAVAILABLE.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gevent
import gevent.lock

from ...errors import Code, TritonError
from ...inference import InferInput, InferRequest, InferResponse
from ...metrics.statistics import VersionStats
from ...repository.ensemble_graph import Graph, Step
from ...runtime import fastpath
from ...runtime.kernel import InlineActor, Reply
from ...runtime.response_channel import (
    STREAM_MAX_BYTES,
    STREAM_MAX_RESPONSES,
    BoundedResponseChannel,
    OpenStreams,
    ResponseChannel,
)
from ...runtime.wake_timer import Wake, WakeTimer
from .ensemble_chain import ChainSteps, is_chain
from .ensemble_run import _Run, _StepAnswered, _StepStreamed, _Table
from .ensemble_step import MEMO_SIZE, StepPlan, StepReply, answer_outputs, checked_batch, reshaped_step
from .ensemble_waits import WaitGraphReads
from .scheduler import Drain, Enqueue, GetStats, GetStatus

log = logging.getLogger(__name__)

Routes = Callable[[], Mapping[str, Any]]  # name → ModelHandle (the repository's routing table, read live)

# Steps started in one hub turn; the rest wait for the next turns (a zero-delay loop timer: the hub polls its
# sockets in between). A step costs about 30 µs here (request, routing, validation, the composing model's
# scheduler and its inline run): 2000 side-by-side steps of one request started in one go made health checks
# wait up to 67 ms; 64 a turn, 2.5 ms (scripts/bench_wide_ensemble.py, docs/performance.md#wide-ensembles).
STEPS_PER_TURN = 64

# _start builds a step's request with fastpath.new_tuple: the field order it relies on
assert InferRequest._fields[11:] == ("responses", "is_cancelled", "trace"), InferRequest._fields


class EnsembleScheduler(ChainSteps, WaitGraphReads, InlineActor):
    """The scheduler of one ensemble version."""

    def __init__(self, name: str, graph: Graph, routes: Routes, stats: VersionStats, max_inflight: int = 0,
                 steps_per_turn: int = STEPS_PER_TURN, turns: Callable[[Callable[[object], None]], Any] = WakeTimer,
                 version: int = 1, streams: OpenStreams | None = None) -> None:
        # turns(tell): the next-hub-turn timer (tests pass a manual one); streams: the server's open channels
        super().__init__(name)
        self._streams = streams
        self._graph = graph
        self._routes = routes
        self._stats = stats
        self._max_inflight = max_inflight
        self._version = version  # the span's triton.model_version
        self._runs: set[_Run] = set()
        self._drains: list[Reply[None]] = []
        self._ready: collections.deque[tuple[_Run, _Table, Step]] = collections.deque()  # FIFO, all runs
        self._steps_per_turn = steps_per_turn
        self._turn = turns(self.ref.tell)  # armed while steps wait in ``_ready``
        self._plans = [StepPlan(step) for step in graph.steps]  # by step index
        self._checked = fastpath.BoundedCache(f"ensemble steps of {name}", MEMO_SIZE)  # ensemble_step.checked_batch
        # steps answered on the stack that started them (inline), handled in order by the outermost _start_ready
        self._here: collections.deque[tuple[_Run, _Table, Step, Reply[InferResponse]]] = collections.deque()
        self._flushing = False
        self._chained = is_chain(graph)  # its steps run as a loop (ensemble_chain.py; fast path)

    def direct(self, item: Enqueue) -> bool:
        """Handle ``item`` now on the caller's stack, as its :class:`Enqueue` would be handled (a fast path:
        no trip through the mailbox); only while this actor is idle with nothing queued (``hold``), so
        the request overtakes none. False: send it as an Enqueue."""
        if not fastpath.enabled or not self.hold():
            return False
        try:
            self.on_Enqueue(item)
        except Exception as e:  # a bug of ours: to the request, as a handler's error goes to its message's reply
            log.exception("ensemble %s: a request failed to start", self._graph.name)
            if not item.reply.ready():
                item.reply.fail(e)
        finally:
            self.unhold()
        return True

    # -- messages ---------------------------------------------------------------------------------
    def on_Enqueue(self, msg: Enqueue) -> None:
        run = _Run(msg, msg.request.responses)
        if msg.request.trace is not None:  # Triton: the ensemble's span is the parent of its steps' spans
            run.span, run.trace = msg.request.trace.open(self._graph.name, self._version, msg.request.id, msg.start_ns)
        self._runs.add(run)
        table = _Table(dict(msg.request.inputs), set())
        run.tables.append(table)
        run.open_tables = 1
        try:
            if self._chained and fastpath.enabled:
                self._chain(run, table, 0)
            else:
                self._advance(run, table, table.tensors)
        except Exception as e:  # a bug of ours, or an error no step handles: this request fails, and is not left in flight
            log.exception("ensemble %s: starting a request failed", self._graph.name)
            self._fail(run, e)

    def on__StepAnswered(self, msg: _StepAnswered) -> None:
        self._answered_safely(msg.run, msg.table, msg.step, msg.reply)

    def _answered_safely(self, run: _Run, table: _Table, step: Step, reply: Reply[InferResponse]) -> None:
        """:meth:`_answered`; what it raises besides its own TritonErrors (a bug of ours, an output no step
        can take) fails that request, which would otherwise wait for ever, and nothing else."""
        try:
            self._answered(run, table, step, reply)
        except Exception as e:
            log.exception("ensemble %s: handling step %d's answer failed", self._graph.name, step.index)
            self._fail(run, e)

    def _answered(self, run: _Run, table: _Table, step: Step, reply: Reply[InferResponse]) -> None:
        table.plain -= 1
        table.running.discard(step.index)
        if run.failed:
            return
        error = reply.exception()
        if error is not None:
            self._fail(run, error)
            return
        response = reply.value()
        try:
            outputs = self._plans[step.index].mapped(response)
        except TritonError as e:
            self._fail(run, e)
            return
        if response.timings is not None:  # summed when the request ends
            steps = run.timings
            steps.append(response.timings)
            if len(steps) > 64:  # a stream's forks run steps without end: the list stays short
                steps[:] = [tuple(map(sum, zip(*steps, strict=True)))]
        if table.at >= 0:  # a chain's step: the loop goes on with the next one
            table.tensors.update(outputs)
            self._chain(run, table, step.index + 1)
        elif table.children:
            self._publish(run, table, outputs)
        else:  # no forks to hand them to (a plain table): what _publish would do, without the call
            table.tensors.update(outputs)
            self._advance(run, table, outputs)

    def on__StepStreamed(self, msg: _StepStreamed) -> None:
        run, table, item = msg.run, msg.table, msg.item
        if msg.final:
            table.streams -= 1
            table.running.discard(msg.step.index)
        if run.failed:
            if msg.gate is not None and isinstance(item, InferResponse):
                msg.gate.release()
            return
        if isinstance(item, BaseException):
            self._fail(run, item)
            return
        if isinstance(item, InferResponse):
            try:
                outputs = self._plans[msg.step.index].mapped(item)
            except TritonError as e:
                self._fail(run, e)
                return
            fork = _Table(dict(table.tensors), set(table.started), parent=table,
                          release=msg.gate.release if msg.gate is not None else None)
            fork.tensors.update(outputs)
            table.children.append(fork)
            run.tables.append(fork)
            run.open_tables += 1
            self._advance(run, fork, outputs)
        if msg.final:
            self._settle(run, table)

    def on_GetStats(self, _msg: GetStats) -> dict[str, object]:
        return self._stats.snapshot()

    def on_GetStatus(self, _msg: GetStatus) -> dict[str, object]:
        """The status page's view: requests in flight; an ensemble has no queue or instances of its own."""
        return {"stats": self._stats.snapshot(), "queued": 0, "running": len(self._runs), "busy_instances": 0,
                "instances": []}

    def on_Wake(self, msg: Wake) -> None:
        """The next hub turn: start the next steps that wait."""
        self._turn.woke(msg)
        self._start_ready()

    def on_Drain(self, msg: Drain) -> None:
        self._drains.append(msg.reply)
        self._maybe_drained()

    def on_stop(self) -> None:
        self._turn.stop()
        self._ready.clear()
        self._here.clear()
        error = TritonError.unavailable(f"model version '{self.name}' is unloading")
        for run in list(self._runs):
            self._fail(run, error)
        for reply in self._drains:
            reply.set(None)
        self._drains.clear()

    # -- the data flow ----------------------------------------------------------------------------
    def _advance(self, run: _Run, table: _Table, tensors: Iterable[str]) -> None:
        """Start the steps of ``table`` that read one of the new ``tensors`` and now have all their
        inputs (graph order; only their consumers are looked at, so a step's answer costs what reads
        it, not the whole graph); settle the table when nothing is left. Past ``STEPS_PER_TURN``
        started in this turn, steps wait for later hub turns."""
        consumers, plans, started, have = self._graph.consumers, self._plans, table.started, table.tensors
        if len(tensors) == 1:  # one new tensor (a one-output step): its readers, already in graph order
            for t in tensors:
                ready: Iterable[int] = consumers.get(t, ())
        else:
            ready = sorted({i for t in tensors for i in consumers.get(t, ())})
        for i in ready:
            if i in started:
                continue
            plan = plans[i]
            for t in plan.reads:
                if t not in have:
                    break
            else:
                started.add(i)
                table.running.add(i)
                table.queued += 1
                self._ready.append((run, table, plan.step))
        if not self._turn.armed:
            self._start_ready()
        if not (table.plain or table.queued or table.streams):  # else _settle returns at once
            self._settle(run, table)

    def _start_ready(self) -> None:
        """Start up to ``STEPS_PER_TURN`` waiting steps (of any request, in order); arm the timer for
        the next turn if more wait."""
        queue = self._ready
        budget = self._steps_per_turn
        while queue and budget:
            run, table, step = queue.popleft()
            table.queued -= 1
            if run.failed:
                continue
            budget -= 1
            self._start(run, table, step)
        if queue:
            self._turn.arm(time.perf_counter_ns(), 0)
        if self._here and not self._flushing:
            self._flush_here()

    def _flush_here(self) -> None:
        """Handle the steps answered on the stacks that started them, in order, each as its
        :class:`_StepAnswered` would be (the composing scheduler finished its batch before ``_start``
        returned); the next steps they start append here too and are handled by this same loop."""
        self._flushing = True
        try:
            here = self._here
            while here:  # one answer that fails fails its request only: the others after it go on
                self._answered_safely(*here.popleft())
        finally:
            self._flushing = False

    def _publish(self, run: _Run, table: _Table, outputs: dict[str, InferInput]) -> None:
        """A plain step's outputs go to its table and to the forks made from it meanwhile; the forks
        first, so none of them settles (when the table does) before it has them."""
        table.tensors.update(outputs)
        if table.children:
            for child in list(table.children):
                if not child.settled and not run.failed:
                    self._publish(run, child, outputs)
        if not run.failed:
            self._advance(run, table, outputs)

    def _start(self, run: _Run, table: _Table, step: Step) -> None:
        top = run.msg.request
        if run.decoupled is not None and run.decoupled.is_cancelled():
            self._cancelled(run)
            return
        plan = self._plans[step.index]
        request = fastpath.new_tuple(InferRequest, (
            step.model, step.version, top.id, plan.inputs(table.tensors), plan.requested, top.parameters, False,
            top.priority, top.timeout_us, top.correlation_id, top.flags, None, None,
            run.trace.spawn() if run.trace is not None else None))
        channel = None
        try:
            handle = self._routes().get(step.model)
            if handle is None:
                raise TritonError.not_found(f"Request for unknown model: '{step.model}' is not found")
            version = handle.resolve(step.version)
            decoupled = handle.config.model_transaction_policy.decoupled
            if decoupled or not fastpath.enabled:  # batching on one side only (ensemble_step.py)
                request = request._replace(inputs=version.validator.batch_reshaped(request.inputs))
            if decoupled:
                channel = BoundedResponseChannel(self._max_inflight or STREAM_MAX_RESPONSES, STREAM_MAX_BYTES,
                                                 streams=self._streams)
                request = request._replace(responses=channel)
                reply = version.infer(request)
            elif fastpath.enabled:  # answered on the stack that completes it (ensemble_step.py)
                reply = StepReply()
                try:
                    batch = checked_batch(self._checked, step.index, version, request)
                except TritonError as e:  # (nothing is paid for this on the way that is not refused)
                    request, batch = reshaped_step(self._checked, step.index, version, request, e)
                version.enqueue(request, batch, reply)
                table.plain += 1
                if reply.ready():  # the model ran inline, its batch is finished: handled once this step is
                    self._here.append((run, table, step, reply))
                else:  # completed later: through the mailbox (or a hub callback)
                    reply.then(lambda r: self._step_answered(_StepAnswered(run, table, step, r)))
                return
            else:
                reply = version.infer(request)
        except TritonError as e:
            if channel is not None:
                channel.close()
            self._fail(run, e)
            return
        except (gevent.GreenletExit, gevent.Timeout):
            if channel is not None:
                channel.close()
            self._cancelled(run)
            raise
        if channel is None:
            table.plain += 1
            tell = self.ref.tell
            reply.link(lambda r: _quiet(tell, _StepAnswered(run, table, step, r)))
        else:
            table.streams += 1
            run.readers.append(gevent.spawn(self._read_stream, run, table, step, channel, reply))

    def _step_answered(self, msg: _StepAnswered) -> None:
        """A step's StepReply completed. While this actor drains (a step it started ran inline below it),
        the answer is queued behind the composing scheduler's handler, so that one finishes its batch
        (statistics, trace spans) first; completed from elsewhere (an instance thread's completion),
        it is told in the next hub callback, as a linked Reply is."""
        if self._draining:
            _quiet(self.ref.tell, msg)
        else:
            gevent.get_hub().loop.run_callback(_quiet, self.ref.tell, msg)

    def _read_stream(self, run: _Run, table: _Table, step: Step, channel: ResponseChannel,
                     reply: Reply[InferResponse]) -> None:
        """Reader greenlet of one decoupled step: forwards its responses as messages; with
        ``max_inflight_requests`` it waits for a free slot before taking the next response, so a fast
        producer waits for the slow steps after it instead of filling memory. It waits as well while
        the ensemble's own stream holds its bound of responses its client has not taken (the
        ensemble's actor answers on the hub, where a send never waits)."""
        reply.link(lambda r: channel.send(r.exception(), True) if r.exception() is not None else None)
        gate = None
        if self._max_inflight > 0:
            gate = run.gates.setdefault(step.index, gevent.lock.Semaphore(self._max_inflight))
        try:
            top = run.decoupled
            while True:
                if top is not None:  # the ensemble's client takes its responses slower: this step waits too
                    top.wait_for_room()
                item, final = channel.receive()
                if top is not None and top.is_cancelled():
                    channel.cancelled = True  # the ensemble's client went away: so did this step's
                if gate is not None and isinstance(item, InferResponse):
                    gate.acquire()
                _quiet(self.ref.tell, _StepStreamed(run, table, step, item, final, gate))
                if final:
                    return
        finally:
            if not channel.finished:
                channel.cancelled = True  # the run failed or the server stops: the model sees is_cancelled()
            channel.close()

    def _settle(self, run: _Run, table: _Table) -> None:
        """A table with nothing in flight (nor a plain step of its parents) is done: answers with every output."""
        if table.settled or table.plain or table.streams or table.queued or run.failed:
            return
        parent = table.parent
        while parent is not None:
            if parent.plain or parent.queued:
                return
            parent = parent.parent
        table.settled = True
        if all(o in table.tensors for o in self._graph.outputs):  # the last table: nothing is in flight after it
            self._answer(run, table, run.open_tables == 1)
        table.tensors = {}
        for child in table.children:
            self._settle(run, child)
        if table.release is not None:
            table.release()
        run.open_tables -= 1
        if run.open_tables == 0:
            self._close_run(run)

    def _answer(self, run: _Run, table: _Table, final: bool) -> None:
        """``final``: no step is in flight, so the response carries the final flag (as Triton's ensemble's)."""
        wanted = run.msg.request.requested_output_names
        outputs = answer_outputs(self._graph.outputs, table.tensors, wanted)  # (ensemble_step.ABSENT left out)
        run.answered += 1
        if run.decoupled is not None:
            run.decoupled.send(InferResponse(outputs), final)
            run.final_sent = final
        elif run.answered == 1:
            run.msg.reply.set(InferResponse(outputs))

    def _close_run(self, run: _Run) -> None:
        self._runs.discard(run)
        for table in run.tables:  # a fork and its parent point at each other: a cycle per decoupled response
            table.parent, table.children = None, []
        msg = run.msg
        now = time.perf_counter_ns()
        if run.answered == 0:
            self._stats.record_failure(now - msg.start_ns)
            error = TritonError.internal(f"ensemble '{self._graph.name}' finished without producing its outputs")
            if run.decoupled is not None:
                run.decoupled.send(error, True)
            msg.reply.fail(error)
        else:
            # Triton: the ensemble's queue and compute times are its steps' (core's secondary stats aggregator)
            queue_ns, ci, inf, co = map(sum, zip(*run.timings, strict=True)) if run.timings else (0, 0, 0, 0)
            self._stats.record_success(msg.batch_size, now - msg.start_ns, queue_ns, (ci, inf, co))
            self._stats.last_inference = time.time_ns() // 1_000_000
            if run.decoupled is not None and not run.final_sent:
                run.decoupled.send(None, True)
            msg.reply.set(None)  # type: ignore[arg-type]  # ignored when answered above (decoupled: unused)
        if run.span is not None:
            run.trace.close(run.span)
        self._maybe_drained()

    def _cancelled(self, run: _Run) -> None:
        """The request fails CANCELLED and ends: its client cancelled its stream, or the greenlet running a
        step inline was killed (a client's cancel, a timeout) while the model yielded; a run left in
        flight there would keep a Drain (an unload's) waiting for ever, its steps seen by the BLS wait graph."""
        self._fail(run, TritonError(Code.CANCELLED, "[request id: " + (run.msg.request.id or "<id_unknown>") + "] cancelled"))

    def _fail(self, run: _Run, error: BaseException) -> None:
        """The request fails with the step's error; its tensors go, its other steps' answers are ignored."""
        if run.failed:
            return
        run.failed = True
        self._runs.discard(run)
        msg = run.msg
        self._stats.record_failure(time.perf_counter_ns() - msg.start_ns)
        if not isinstance(error, TritonError):
            error = TritonError.internal(repr(error))
        if run.decoupled is not None:
            run.decoupled.send(error, True)
        msg.reply.fail(error)
        if run.span is not None:
            run.trace.close(run.span)
        for reader in run.readers:
            reader.kill(block=False)
        run.readers.clear()
        for table in run.tables:
            table.tensors = {}
        run.tables.clear()
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        if self._drains and not self._runs:
            for reply in self._drains:
                reply.set(None)
            self._drains.clear()


def _quiet(tell: Callable[[object], None], message: object) -> None:
    try:
        tell(message)
    except TritonError:
        pass  # the scheduler stopped: on_stop already failed the request


def ensemble_of(routes: Routes, key: tuple[str, int]) -> EnsembleScheduler | None:
    """The scheduler of version ``key`` if it is an ensemble's (the BLS wait graph's ``composite_of``)."""
    handle = routes().get(key[0])
    version = handle.versions.get(key[1]) if handle is not None else None
    scheduler = version.scheduler if version is not None else None
    return scheduler if isinstance(scheduler, EnsembleScheduler) else None

"""An ensemble whose steps form a chain, run as a loop over its steps (a fast path of the ensemble scheduler).

Owned by :class:`~.ensemble.EnsembleScheduler` (a mixin of it, hub thread). Most pipelines are chains:
each step reads what the step before it wrote (and tensors written earlier or given by the client), so
the data flow can only run them in their order, one at a time. For such a graph (:func:`is_chain`) the
request's table goes from one step to the next by index: no search for the steps a new tensor makes
ready, no ready queue and no settling per step, and a step whose model ran inline on this stack is
followed by the next one in the same loop. What a step does is the data flow's (its request built from
its plan, routed when it starts, its model's validator memo, its scheduler, statistics, traces,
cancellation); the table's ``at`` says which step is in flight, for the BLS wait graph. Whatever the
loop does not handle goes back to the data flow at the step it reached: a decoupled composing model
(its responses fork the table), steps of other requests waiting for the next hub turn (their order is
kept), and the fast-path switch off (the data flow is the specification).
"""

from __future__ import annotations

import logging
import time
from operator import attrgetter
from typing import Any

from gevent import GreenletExit, Timeout

from ...errors import TritonError
from ...inference import InferRequest, InferResponse
from ...repository.ensemble_graph import Graph
from ...runtime import fastpath
from .ensemble_run import _Run, _StepAnswered, _Table
from .ensemble_step import ABSENT, StepReply, answer_outputs, checked_batch, reshaped_step

log = logging.getLogger(__name__)
_perf_ns = time.perf_counter_ns
_NAME = attrgetter("name")
_time_ns = time.time_ns


def is_chain(graph: Graph) -> bool:
    """Whether every step reads an output of the step before it, and nothing written after it: the data
    flow then runs the steps in index order, each once the one before it answered."""
    known = set(graph.inputs)
    before: set[str] = set()
    for k, step in enumerate(graph.steps):
        reads = {tensor for _, tensor in step.inputs}
        if step.index != k or not reads <= known or (k and not reads & before):
            return False
        before = {tensor for _, tensor in step.outputs}
        known |= before
    return bool(graph.steps)


class ChainSteps:
    """The loop over a chain's steps (mixed into the ensemble scheduler, whose state it uses)."""

    # its state and methods are the ensemble scheduler's (ensemble.py)
    _plans: list[Any]
    _checked: Any
    _routes: Any
    _turn: Any
    _graph: Graph
    _runs: set[_Run]
    _stats: Any
    _drains: list[Any]
    _fail: Any
    _cancelled: Any

    def _chain(self, run: _Run, table: _Table, k: int) -> None:
        """Run steps ``k``.. of ``run``'s chain, one after another while each answers on this stack; a
        step answered later comes back through :meth:`_answered`, which calls this for the next one."""
        plans, tensors, top = self._plans, table.tensors, run.msg.request
        last = len(plans)
        tail = None
        while True:
            if k == last:  # every step answered: the request answers
                self._finish_chain(run, table, k)
                return
            if run.failed:
                return
            if run.decoupled is not None and run.decoupled.is_cancelled():
                self._cancelled(run)
                return
            plan = plans[k]
            step = plan.step
            if self._turn.armed:  # steps of other requests wait for the next hub turn: this one waits behind them
                self._to_data_flow(run, table, k)
                return
            try:
                inputs = plan.inputs(tensors)
            except KeyError:  # a step before gave no tensor this one reads: the data flow would start no more
                self._leave_chain(table, k)
                self._settle(run, table)
                return
            try:
                handle = self._routes().get(step.model)
                if handle is plan.handle:  # as routed last time (a handle is an immutable snapshot)
                    version = plan.version
                else:
                    if handle is None:
                        raise TritonError.not_found(f"Request for unknown model: '{step.model}' is not found")
                    version = handle.resolve(step.version)
                    if handle.config.model_transaction_policy.decoupled:  # its responses fork the table
                        self._to_data_flow(run, table, k)
                        return
                    plan.handle, plan.version, plan.runner = handle, version, version.step_runner()
                if tail is None:  # what every step's request takes from the ensemble's (once per run)
                    tail = (top.parameters, False, top.priority, top.timeout_us, top.correlation_id, top.flags, None, None)
                    if run.trace is None:
                        tail += (None,)
                if run.trace is None:
                    request = fastpath.new_tuple(InferRequest, (step.model, step.version, top.id, inputs, plan.requested, *tail))
                else:
                    request = fastpath.new_tuple(InferRequest, (
                        step.model, step.version, top.id, inputs, plan.requested, *tail, run.trace.spawn()))
                table.at = k  # in flight (the BLS wait graph reads it)
                try:
                    batch = checked_batch(self._checked, k, version, request)
                except TritonError as e:  # batching on one side only (ensemble_step.py): nothing paid otherwise
                    request, batch = reshaped_step(self._checked, k, version, request, e)
                # its scheduler runs it here when it can, with no Enqueue and no reply: its response
                runner = plan.runner
                answer = runner(request, batch, StepReply) if runner is not None else None
                if answer is None:  # not taken: enqueued, as the data flow's steps are
                    answer = StepReply()
                    version.enqueue(request, batch, answer)
            except TritonError as e:
                self._fail(run, e)
                return
            except (GreenletExit, Timeout):  # killed while its model yielded inline
                self._cancelled(run)
                raise
            if type(answer) is InferResponse:
                response = answer
            else:
                if not answer._done:  # completed later: through the mailbox, as the data flow's steps are
                    table.plain += 1
                    answer.then(lambda r, step=step: self._step_answered(_StepAnswered(run, table, step, r)))
                    return
                if answer._error is not None:
                    self._fail(run, answer._error)
                    return
                response = answer._value
            try:
                tensors.update(plan.mapped(response))
            except Exception as e:  # an output no step can take (or a bug of ours): this request fails, only it
                if not isinstance(e, TritonError):
                    log.exception("ensemble %s: handling step %d's answer failed", self._graph.name, k)
                self._fail(run, e)
                return
            if response.timings is not None:  # summed when the request ends
                run.timings.append(response.timings)
            k += 1

    def _finish_chain(self, run: _Run, table: _Table, k: int) -> None:
        """Every step answered: what ``_settle``, ``_answer`` and ``_close_run`` do for a run's only
        table, in one go (a plain run: not streamed, not traced, nothing else in flight; any other
        takes them). As there: no answer unless the table holds every ensemble output, requested or
        not; the ensemble's statistics (its steps' queue and compute times) are counted before the
        reply is set."""
        self._leave_chain(table, k)
        if run.decoupled is not None or run.span is not None or run.open_tables != 1 or table.plain or table.settled:
            self._settle(run, table)
            return
        tensors = table.tensors
        table.settled, table.tensors, run.open_tables = True, {}, 0
        try:
            outputs = [(name, tensors[name].data) for name in self._graph.outputs]
        except KeyError:  # an output no step gave: the run ends without an answer (_close_run's error)
            self._close_run(run)
            return
        msg = run.msg
        wanted = msg.request.outputs
        if wanted is not None:
            names = set(map(_NAME, wanted))
            if not names.issuperset(self._graph.outputs):  # most requests ask for every output, or none
                outputs = [o for o in outputs if o[0] in names]
        if ABSENT in tensors.values():  # a step answered without one: left out (tuple ==: C, the names differ)
            outputs = answer_outputs(self._graph.outputs, tensors, None if wanted is None else names)
        run.answered = 1
        self._runs.discard(run)
        now = _perf_ns()
        timings = run.timings
        queue_ns, ci, inf, co = map(sum, zip(*timings, strict=True)) if timings else (0, 0, 0, 0)
        stats = self._stats
        stats.record_success(msg.batch_size, now - msg.start_ns, queue_ns, (ci, inf, co))
        stats.last_inference = _time_ns() // 1_000_000
        msg.reply.set(InferResponse(outputs))
        if self._drains:
            self._maybe_drained()

    def _to_data_flow(self, run: _Run, table: _Table, k: int) -> None:
        """The data flow takes the table over at step ``k``, as if it had run the steps before it."""
        self._leave_chain(table, k)
        self._advance(run, table, self._plans[k].reads)

    @staticmethod
    def _leave_chain(table: _Table, k: int) -> None:
        """The table as the data flow keeps it, having started steps ``0..k-1`` (none in flight)."""
        table.at = -1
        table.started = set(range(k))

"""The ensemble scheduler (actors/scheduling/ensemble.py) with fake composing models: steps start a few per hub
turn, forks wait for the steps their table has not started yet, and what the BLS wait graph reads."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import gevent
import numpy as np
import pytest
from google.protobuf import text_format

from triton_actor.actors.scheduling.ensemble import EnsembleScheduler
from triton_actor.actors.scheduling.ensemble_chain import is_chain
from triton_actor.actors.scheduling.scheduler import Drain, Enqueue
from triton_actor.errors import TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.metrics.statistics import VersionStats
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository.config import ModelConfig
from triton_actor.repository.ensemble_graph import check_scheduling
from triton_actor.runtime import fastpath
from triton_actor.runtime.kernel import Reply
from triton_actor.runtime.response_channel import BoundedResponseChannel
from triton_actor.runtime.wake_timer import Wake

pytestmark = pytest.mark.usefixtures("fast_paths")


class ManualTurns:
    """The next-hub-turn timer, fired by the test."""

    def __init__(self, tell: Callable[[object], None]) -> None:
        self.tell = tell
        self.armed = False

    def arm(self, _now: int, _wait_ns: int) -> None:
        self.armed = True

    def woke(self, _msg: Wake) -> None:
        self.armed = False

    def stop(self) -> None:
        self.armed = False

    def fire(self) -> None:
        assert self.armed
        self.tell(Wake(self))


class AcceptsAll:
    """A composing model's validator that accepts every request (batch size 1)."""

    def check(self, _request: InferRequest) -> int:
        return 1

    def batch_reshaped(self, inputs: dict) -> dict:
        return inputs


class FakeModel:
    """A composing model: every request it gets waits in ``calls`` for the test to answer it (``infer``
    on the slow path, ``enqueue`` with the ensemble's own reply on the fast path)."""

    validator = AcceptsAll()

    def __init__(self, name: str, decoupled: bool = False) -> None:
        self.name = name
        self.config = SimpleNamespace(model_transaction_policy=SimpleNamespace(decoupled=decoupled))
        self.version = 1
        self.versions = {1: self}
        self.calls: list[tuple[InferRequest, Reply[InferResponse]]] = []

    def resolve(self, _version: int) -> FakeModel:
        return self

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        reply: Reply[InferResponse] = Reply()
        self.calls.append((request, reply))
        return reply

    def enqueue(self, request: InferRequest, _batch: int, reply: Reply[InferResponse]) -> None:
        self.calls.append((request, reply))

    def step_runner(self) -> None:
        return None  # a chain's step is enqueued (the scheduler's step_direct is the real handle's)


class InlineModel(FakeModel):
    """A composing model that answers on the caller's stack (Y = X), as a model promoted to run inline."""

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        reply = super().infer(request)
        reply.set(InferResponse([("Y", request.inputs["X"].data)]))
        return reply

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        super().enqueue(request, batch, reply)
        reply.set(InferResponse([("Y", request.inputs["X"].data)]))


def _tensor(name: str, value: float) -> InferInput:
    return InferInput(name, BY_WIRE["FP32"], (1,), np.array([value], np.float32))


def _graph(outputs: list[str], steps: list[tuple[str, dict[str, str], dict[str, str]]], decoupled: bool = False,
           inputs: tuple[str, ...] = ("IN",)) -> Any:
    maps = []
    for model, ins, outs in steps:
        imap = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items())
        omap = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items())
        maps.append(f'{{ model_name: "{model}" model_version: -1 {imap} {omap} }}')
    text = f"""
name: "ens"
platform: "ensemble"
input [ {", ".join(f'{{ name: "{name}", data_type: TYPE_FP32, dims: [ 1 ] }}' for name in inputs)} ]
output [ {", ".join(f'{{ name: "{o}", data_type: TYPE_FP32, dims: [ 1 ] }}' for o in outputs)} ]
ensemble_scheduling {{ step [ {", ".join(maps)} ] }}
{"model_transaction_policy { decoupled: true }" if decoupled else ""}
"""
    return check_scheduling(text_format.Parse(text, ModelConfig()))


def _scheduler(graph: Any, models: list[FakeModel], per_turn: int) -> tuple[EnsembleScheduler, ManualTurns]:
    turns: list[ManualTurns] = []

    def make(tell: Callable[[object], None]) -> ManualTurns:
        turns.append(ManualTurns(tell))
        return turns[0]

    routes = {m.name: m for m in models}
    sched = EnsembleScheduler("ensemble:ens:1", graph, lambda: routes, VersionStats("ens", 1), steps_per_turn=per_turn,
                              turns=make)
    sched.start()
    return sched, turns[0]


def _enqueue(sched: EnsembleScheduler, responses: Any = None, inputs: tuple[str, ...] = ("IN",)) -> Reply[InferResponse]:
    reply: Reply[InferResponse] = Reply()
    request = InferRequest("ens", 1, "", {name: _tensor(name, 2.0) for name in inputs}, responses=responses)
    sched.ref.tell(Enqueue(request, 1, reply, 0))
    return reply


def _handled(condition: Callable[[], bool]) -> None:
    """Let the actor (slow path: its loop greenlet) and the readers run until ``condition`` holds."""
    with gevent.Timeout(10):
        while not condition():
            gevent.idle()


def _answer(model: FakeModel, index: int, name: str = "Y", value: float | None = None) -> None:
    request, reply = model.calls[index]
    x = next(iter(request.inputs.values())).data
    reply.set(InferResponse([(name, x if value is None else np.array([value], np.float32))]))


def test_a_wide_step_set_starts_a_few_per_turn() -> None:
    ident = FakeModel("ident")
    names = [f"O{i}" for i in range(5)]
    sched, turns = _scheduler(_graph(names, [("ident", {"X": "IN"}, {"Y": o}) for o in names]), [ident], 2)
    reply = _enqueue(sched)
    _handled(lambda: len(ident.calls) == 2)
    assert turns.armed
    assert sched.runs_need() == [{("ident", 1)}]  # what the BLS wait graph sees: ident, still needed
    turns.fire()
    _handled(lambda: len(ident.calls) == 4)
    turns.fire()
    _handled(lambda: len(ident.calls) == 5)
    assert not turns.armed
    for i in range(5):
        _answer(ident, i)
    response = reply.get(timeout=10)
    assert [name for name, _ in response.outputs] == names
    assert sched.runs_need() == []


def test_forks_wait_for_the_steps_their_table_has_not_started() -> None:
    """gen (decoupled) answers while plain steps of the same table still wait for a turn: each fork gets
    their outputs once they run, and join runs once per response."""
    gen, ident, join = FakeModel("gen", decoupled=True), FakeModel("ident"), FakeModel("join")
    wide = [f"P{i}" for i in range(4)]
    graph = _graph(["OUT", *wide[:-1]], [("gen", {"N": "N"}, {"Y": "y"}),
                                        *(("ident", {"X": "IN"}, {"Y": p}) for p in wide),
                                        ("join", {"A": "y", "B": wide[-1]}, {"OUT": "OUT"})], decoupled=True,
                   inputs=("IN", "N"))
    sched, turns = _scheduler(graph, [gen, ident, join], 2)
    stream = BoundedResponseChannel(100)
    reply = _enqueue(sched, stream, ("IN", "N"))
    _handled(lambda: len(gen.calls) == 1 and len(ident.calls) == 1)
    channel = gen.calls[0][0].responses
    for value in (10.0, 20.0):
        channel.send(InferResponse([("Y", np.array([value], np.float32))]), False)
    channel.send(None, True)
    _answer(ident, 0)
    _handled(lambda: not any(t.streams for r in sched._runs for t in r.tables))  # both forks exist, gen ended
    assert not join.calls
    turns.fire()
    _handled(lambda: len(ident.calls) == 3)
    turns.fire()
    _handled(lambda: len(ident.calls) == 4)
    for i in range(1, 4):
        _answer(ident, i)
    _handled(lambda: len(join.calls) == 2)
    for i in range(2):
        request, join_reply = join.calls[i]
        join_reply.set(InferResponse([("OUT", request.inputs["A"].data + request.inputs["B"].data)]))
    got = []
    while True:
        item, final = stream.receive(timeout=10)
        if item is not None:
            got.append({name: float(data[0]) for name, data in item.outputs})
        if final:
            break
    assert sorted(g["OUT"] for g in got) == [12.0, 22.0]
    assert all(g["P0"] == g["P1"] == g["P2"] == 2.0 for g in got)  # every fork got the steps started later
    assert reply.ready()


def test_a_fork_with_nothing_to_run_settles_once_its_parent_started_everything() -> None:
    """A fork of gen's response has nothing to run but waits while its table still has a step queued
    (gen2, decoupled): once that one starts, the fork settles and the request can end."""
    gen, ident = FakeModel("gen", decoupled=True), FakeModel("ident")
    graph = _graph(["y1", "O2"], [("gen", {"N": "N"}, {"Y": "y1"}), ("gen", {"N": "N"}, {"Y": "y2"}),
                                  ("ident", {"X": "y2"}, {"Y": "O2"})], decoupled=True, inputs=("N",))
    sched, turns = _scheduler(graph, [gen, ident], 1)
    stream = BoundedResponseChannel(100)
    _enqueue(sched, stream, ("N",))
    _handled(lambda: len(gen.calls) == 1)
    first = gen.calls[0][0].responses
    first.send(InferResponse([("Y", np.array([1.0], np.float32))]), False)
    first.send(None, True)
    _handled(lambda: not any(t.streams for r in sched._runs for t in r.tables))
    turns.fire()  # gen2 starts: nothing of the table is queued any more
    _handled(lambda: len(gen.calls) == 2)
    gen.calls[1][0].responses.send(None, True)  # gen2 ends without a response
    item, final = stream.receive(timeout=10)
    assert final and "finished without producing its outputs" in str(item)  # the request ended
    assert sched.runs_need() == []


class CountingValidator:
    """A composing model's validator that counts its checks and refuses FP32 inputs of shape (2,)."""

    def __init__(self) -> None:
        self.checks = 0

    def check(self, request: InferRequest) -> int:
        self.checks += 1
        if any(t.shape == (2,) for t in request.inputs.values()):
            raise TritonError.invalid_arg("unexpected shape")
        return 1

    def batch_reshaped(self, inputs: dict) -> dict:  # nothing to reshape: the refusal stands
        return inputs


def _chain() -> Any:
    return _graph(["OUT"], [("first", {"X": "IN"}, {"Y": "T"}), ("second", {"X": "T"}, {"Y": "OUT"})])


def test_the_next_step_starts_on_the_stack_that_answered_the_last() -> None:
    """Fast path: with composing models that answer inline, a step's answer starts the next step on the
    same stack, and the whole chain is answered before the ensemble's Enqueue returns (no hub turn in
    between); the slow path gets there one hub turn per step later. Tensors are handed on uncopied."""
    first, second = InlineModel("first"), InlineModel("second")
    sched, _turns = _scheduler(_chain(), [first, second], 64)
    reply = _enqueue(sched)
    if fastpath.enabled:
        assert reply.ready() and len(second.calls) == 1
    _handled(reply.ready)
    assert second.calls[0][0].inputs["X"].data is first.calls[0][0].inputs["X"].data
    assert reply.get(timeout=10).outputs[0][0] == "OUT"


def test_a_long_chain_of_inline_steps_is_a_loop_not_a_recursion() -> None:
    """Fast path: 1500 chained steps whose model answers inline, each handled after the step that started it
    returned (no message, no frame per step left on the stack): past the interpreter's recursion limit of
    1000, a chain handled by recursion would fail; every step's request reaches its model once, in order."""
    n = 1500
    steps = [("link", {"X": "IN" if i == 0 else f"T{i}"}, {"Y": "OUT" if i == n - 1 else f"T{i + 1}"}) for i in range(n)]
    link = InlineModel("link")
    sched, _turns = _scheduler(_graph(["OUT"], steps), [link], 64)
    reply = _enqueue(sched)
    if fastpath.enabled:
        assert reply.ready()
    _handled(reply.ready)
    assert reply.get(timeout=10).outputs[0][0] == "OUT"
    assert len(link.calls) == n
    assert all(call[0].inputs["X"].data is link.calls[0][0].inputs["X"].data for call in link.calls)


class OddInlineModel(InlineModel):
    """Answers inline with an output no step can take (a list, not an array): a step's answer that
    raises a non-Triton error where the ensemble maps it."""

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        reply: Reply[InferResponse] = Reply()
        self.enqueue(request, 1, reply)
        return reply

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        self.calls.append((request, reply))
        reply.set(InferResponse([("Y", [1.0])]))


def test_an_answer_that_breaks_the_ensemble_fails_its_request_and_the_next_is_served() -> None:
    """An inline step's answer the ensemble cannot handle fails that request (INTERNAL, with the error)
    instead of leaving it, and the answers queued behind it, waiting; the next request is served."""
    first, second = InlineModel("first"), OddInlineModel("second")
    sched, _turns = _scheduler(_chain(), [first, second], 64)
    reply = _enqueue(sched)
    _handled(reply.ready)
    with pytest.raises(TritonError, match="has no attribute 'dtype'"):
        reply.get(timeout=10)
    routes_ok = _enqueue(sched)
    _handled(routes_ok.ready)
    assert len(first.calls) == 2 and len(second.calls) == 2


def test_a_step_answered_from_elsewhere_reaches_the_ensemble_in_a_hub_callback() -> None:
    """An answer completed while the ensemble is idle (an instance thread's completion) is handled in
    the next hub callback, as a linked reply is: the composing scheduler finishes its batch first."""
    first, second = FakeModel("first"), FakeModel("second")
    sched, _turns = _scheduler(_chain(), [first, second], 64)
    reply = _enqueue(sched)
    _handled(lambda: len(first.calls) == 1)
    _answer(first, 0)
    assert not second.calls
    _handled(lambda: len(second.calls) == 1)
    _answer(second, 0)
    assert reply.get(timeout=10).outputs[0][0] == "OUT"


def test_a_step_request_is_checked_once_per_shape_and_still_refused_when_wrong() -> None:
    """Fast path: the composing model's check runs once for a step's input signature, then is
    remembered; a request it refuses fails its ensemble request with that error every time."""
    first, second = FakeModel("first"), FakeModel("second")
    first.validator = CountingValidator()
    sched, _turns = _scheduler(_chain(), [first, second], 64)
    for i in range(3):
        reply = _enqueue(sched)
        _handled(lambda i=i: len(first.calls) == i + 1)
        _answer(first, i)
        _handled(lambda i=i: len(second.calls) == i + 1)
        _answer(second, i)
        reply.get(timeout=10)
    assert first.validator.checks == (1 if fastpath.enabled else 0)  # slow path: infer() checks, as a model's own
    for _ in range(2):
        bad: Reply[InferResponse] = Reply()
        request = InferRequest("ens", 1, "", {"IN": InferInput("IN", BY_WIRE["FP32"], (2,), np.zeros(2, np.float32))})
        sched.ref.tell(Enqueue(request, 1, bad, 0))
        if fastpath.enabled:
            with pytest.raises(TritonError, match="unexpected shape"):
                bad.get(timeout=10)
    assert first.validator.checks == (3 if fastpath.enabled else 0)


def test_which_graphs_are_chains() -> None:
    """A chain: every step reads what the step before it wrote, and nothing written later (its steps run as
    a loop, ensemble_chain.py); side-by-side steps, or a step that reads only the client's tensors, are not."""
    assert is_chain(_chain())
    assert is_chain(_graph(["OUT"], [("a", {"X": "IN"}, {"Y": "T"}), ("b", {"X": "T", "Z": "IN"}, {"Y": "U"}),
                                     ("c", {"X": "U", "Z": "T"}, {"Y": "OUT"})]))
    assert not is_chain(_graph(["O1", "O2"], [("a", {"X": "IN"}, {"Y": "O1"}), ("b", {"X": "IN"}, {"Y": "O2"})]))
    assert not is_chain(_graph(["OUT"], [("b", {"X": "T"}, {"Y": "OUT"}), ("a", {"X": "IN"}, {"Y": "T"})]))


def _three() -> Any:
    return _graph(["OUT"], [("first", {"X": "IN"}, {"Y": "T"}), ("second", {"X": "T"}, {"Y": "U"}),
                            ("third", {"X": "U"}, {"Y": "OUT"})])


def test_a_chain_goes_on_when_a_step_answers_later_and_the_wait_graph_sees_what_is_left() -> None:
    """Steps answered from elsewhere: each answer starts the next step; the BLS wait graph sees the step in
    flight and the ones after it, then nothing once the request is answered."""
    models = [FakeModel(name) for name in ("first", "second", "third")]
    sched, _turns = _scheduler(_three(), models, 64)
    reply = _enqueue(sched)
    for i, model in enumerate(models):
        _handled(lambda model=model: len(model.calls) == 1)
        assert sched.runs_need() == [{(m.name, 1) for m in models[i:]}]
        _answer(model, 0)
    assert reply.get(timeout=10).outputs[0][0] == "OUT"
    assert sched.runs_need() == []


class RenamingInlineModel(OddInlineModel):
    """Answers inline with an output its step does not map (Z, not Y)."""

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        self.calls.append((request, reply))
        reply.set(InferResponse([("Z", request.inputs["X"].data)]))


@pytest.mark.parametrize("inline", [False, True])
def test_a_chain_whose_step_leaves_out_a_tensor_ends_without_the_next_steps(inline: bool) -> None:
    """A step that answers without the tensor the next one reads: as in Triton, the next step gets its
    request without that input (ensemble_step.ABSENT), and fails it (here the fake model's KeyError; a real
    model's check refuses it); the steps after it never run and the run ends."""
    first = RenamingInlineModel("first") if inline else FakeModel("first")
    second, third = InlineModel("second"), InlineModel("third")
    sched, _turns = _scheduler(_three(), [first, second, third], 64)
    reply = _enqueue(sched)
    if not inline:
        _handled(lambda: len(first.calls) == 1)
        _answer(first, 0, name="Z")
    with pytest.raises(TritonError, match="KeyError"):
        reply.get(timeout=10)
    assert not third.calls and sched.runs_need() == []


@pytest.mark.parametrize("inline", [False, True])
def test_a_chain_whose_last_step_leaves_out_an_ensemble_output_fails_and_counts_once(inline: bool) -> None:
    """The end of a chain's run (``_finish_chain``): an ensemble output its step answered without (here OUT)
    is left out of the answer, as Triton leaves it out (ensemble_step.ABSENT); a full answer counts the
    ensemble once, in its statistics before its reply, and only the outputs the request asked for."""
    graph = _graph(["OUT", "T"], [("first", {"X": "IN"}, {"Y": "T"}), ("second", {"X": "T"}, {"Y": "U"}),
                                 ("third", {"X": "U"}, {"Y": "OUT"})])
    third = RenamingInlineModel("third") if inline else FakeModel("third")
    stats = VersionStats("ens", 1)
    routes = {m.name: m for m in (InlineModel("first"), InlineModel("second"), third)}
    sched = EnsembleScheduler("ensemble:ens:1", graph, lambda: routes, stats, steps_per_turn=64,
                              turns=lambda tell: ManualTurns(tell))
    sched.start()
    reply: Reply[InferResponse] = Reply()
    sched.ref.tell(Enqueue(InferRequest("ens", 1, "", {"IN": _tensor("IN", 2.0)}, outputs=(RequestedOutput("OUT"),)),
                           1, reply, 0))
    if not inline:
        _handled(lambda: len(third.calls) == 1)
        _answer(third, 0, name="Z")
    assert reply.get(timeout=10).outputs == []  # OUT left out; T is not asked for
    assert stats.inference_count == 1 and sched.runs_need() == []
    counted: list[int] = []
    good: Reply[InferResponse] = Reply()
    good.link(lambda _r: counted.append(stats.inference_count))  # what a client reading the statistics sees
    routes["third"] = InlineModel("third")
    sched.ref.tell(Enqueue(InferRequest("ens", 1, "", {"IN": _tensor("IN", 2.0)}, outputs=(RequestedOutput("OUT"),)),
                           1, good, 0))
    assert [name for name, _ in good.get(timeout=10).outputs] == ["OUT"]  # T is an output, not requested
    _handled(lambda: bool(counted))
    assert counted == [2]


def test_a_chain_with_a_decoupled_step_streams_through_the_steps_after_it() -> None:
    """A decoupled model in the middle of a chain: the data flow takes the table over there, and each of
    its responses runs the step after it once."""
    first, gen, last = InlineModel("first"), FakeModel("gen", decoupled=True), InlineModel("last")
    graph = _graph(["OUT"], [("first", {"X": "IN"}, {"Y": "T"}), ("gen", {"N": "T"}, {"Y": "U"}),
                             ("last", {"X": "U"}, {"Y": "OUT"})], decoupled=True)
    sched, _turns = _scheduler(graph, [first, gen, last], 64)
    stream = BoundedResponseChannel(100)
    reply = _enqueue(sched, stream)
    _handled(lambda: len(gen.calls) == 1)
    assert sched.runs_need() == [{("gen", 1), ("last", 1)}]  # first ran: the wait graph leaves it out
    channel = gen.calls[0][0].responses
    for value in (10.0, 20.0):
        channel.send(InferResponse([("Y", np.array([value], np.float32))]), False)
    channel.send(None, True)
    got = []
    while True:
        item, final = stream.receive(timeout=10)
        if item is not None:
            got.append(float(item.outputs[0][1][0]))
        if final:
            break
    assert got == [10.0, 20.0] and len(last.calls) == 2
    _handled(reply.ready)
    assert sched.runs_need() == []


def test_a_chain_waits_behind_the_steps_queued_for_the_next_turn() -> None:
    """While steps wait for the next hub turn, a new request's first step waits behind them (in order)."""
    first, second = InlineModel("first"), InlineModel("second")
    sched, turns = _scheduler(_chain(), [first, second], 64)
    turns.armed = True  # as if steps of other requests waited
    reply = _enqueue(sched)
    _handled(lambda: len(sched._ready) == 1)
    assert not first.calls
    turns.fire()
    assert reply.get(timeout=10).outputs[0][0] == "OUT"
    assert len(first.calls) == len(second.calls) == 1


def test_a_chain_step_goes_to_the_model_that_serves_now() -> None:
    """A composing model swapped in the routing table between two requests (a reload publishes a new
    handle): the next request's step goes to the new one, not to the one a step was routed to before."""
    first, second, again = InlineModel("first"), InlineModel("second"), InlineModel("second")
    sched, _turns = _scheduler(_chain(), [first, second], 64)
    _handled(_enqueue(sched).ready)
    sched._routes()["second"] = again
    assert _enqueue(sched).get(timeout=10).outputs[0][0] == "OUT"
    assert len(second.calls) == 1 and len(again.calls) == 1


def test_an_ensemble_request_starts_on_the_callers_stack_only_when_the_actor_is_idle() -> None:
    """Fast path: a request handed to an idle ensemble runs on the caller's stack, no mailbox trip; while
    the actor is busy (held, or handling a message) it is sent as an Enqueue and waits its turn."""
    first, second = InlineModel("first"), InlineModel("second")
    sched, _turns = _scheduler(_chain(), [first, second], 64)

    def item() -> Enqueue:
        return Enqueue(InferRequest("ens", 1, "", {"IN": _tensor("IN", 2.0)}), 1, Reply(), 0)

    now = item()
    assert sched.direct(now) == fastpath.enabled
    assert now.reply.ready() == fastpath.enabled
    if fastpath.enabled:  # (the slow path's actor runs a loop greenlet: never held)
        assert sched.hold()
        assert not sched.direct(item())  # busy: the caller sends it
        sched.unhold()
    assert len(first.calls) == (1 if fastpath.enabled else 0)


class TimedInlineModel(OddInlineModel):
    """Answers inline (Y = X) with the queue and compute times a composing scheduler gives its response."""

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        self.calls.append((request, reply))
        response = InferResponse([("Y", request.inputs["X"].data)])
        response.timings = (1, 10, 100, 1000)
        reply.set(response)


def test_an_ensembles_times_are_its_steps_summed_over_a_long_stream() -> None:
    """The ensemble's queue and compute times are the sums of its steps' (Triton's secondary aggregator),
    kept as a short list even when a decoupled step's responses run the next step 200 times."""
    gen, timed = FakeModel("gen", decoupled=True), TimedInlineModel("timed")
    graph = _graph(["OUT"], [("gen", {"N": "IN"}, {"Y": "T"}), ("timed", {"X": "T"}, {"Y": "OUT"})], decoupled=True)
    sched, _turns = _scheduler(graph, [gen, timed], 64)
    stream = BoundedResponseChannel(1000)
    reply = _enqueue(sched, stream)
    _handled(lambda: len(gen.calls) == 1)
    channel = gen.calls[0][0].responses
    for i in range(200):
        channel.send(InferResponse([("Y", np.array([float(i)], np.float32))]), False)
        _handled(lambda i=i: len(timed.calls) == i + 1)
        assert all(len(run.timings) <= 65 for run in sched._runs)
    channel.send(None, True)
    finals = 0
    while finals < 1:
        _item, final = stream.receive(timeout=10)
        finals += final
    _handled(reply.ready)
    durations = sched._stats.snapshot()["durations"]
    assert [durations[k][1] for k in ("queue", "compute_input", "compute_infer", "compute_output")] == [
        200, 2000, 20000, 200000]


class BrokenModel(InlineModel):
    """A composing model whose call raises something that is not a TritonError (a bug of ours)."""

    def infer(self, request: InferRequest) -> Reply[InferResponse]:
        raise RuntimeError("routing bug")

    def enqueue(self, request: InferRequest, batch: int, reply: Reply[InferResponse]) -> None:
        raise RuntimeError("routing bug")


def test_a_request_whose_first_step_raises_a_bug_fails_and_leaves_nothing_in_flight() -> None:
    """A non-Triton error while the request's first step starts fails that request (INTERNAL), and the request
    is not left in flight: a Drain (an unload) is answered."""
    sched, _turns = _scheduler(_chain(), [BrokenModel("first"), InlineModel("second")], 64)
    reply = _enqueue(sched)
    with pytest.raises(TritonError, match="routing bug"):
        reply.get(timeout=10)
    assert not sched._runs
    drained: Reply[None] = Reply()
    sched.ref.tell(Drain(drained))
    drained.get(timeout=10)

"""What the ensemble scheduler prepares once per step, and the fast path of one step (docs/performance.md#where-a-pipeline-steps-time-goes).

A :class:`StepPlan` per step of the graph, built when the ensemble version loads: the outputs the step
asks for and the map from its model's output names to ensemble tensors, so a step allocates neither
again. Hub thread, owned by the :class:`~.ensemble.EnsembleScheduler`.

The fast path (:mod:`...runtime.fastpath`; with it off every step takes the slow path, which is the
specification): a step's request skips its model's :class:`~..model.validation.RequestValidator` when
the same validator already accepted the same input names, types and shapes for that step (a bounded
memo: the check depends on nothing else, so the answer is the same; a request it would refuse is never
memoized and is refused as before), and a reply completed while its step starts (the model ran inline)
is handled as soon as ``_start`` returns, in the ensemble's own loop over such answers, with no message
(:class:`StepReply`; one completed later calls the ensemble back from the completing stack, queued while
the ensemble drains, else in the next hub callback as a linked reply is). With composing models that run
inline, a whole chain of steps then runs in the request's greenlet as a loop: no hub turn, no message and
no greenlet per step, and no stack frame left per step (a chain of 1500 steps is tested). Everything else is the slow path's: the request still goes through its model's scheduler
(statistics, dynamic batching, queue policy, ``max_inflight``, traces) and response cache front.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from ...errors import TritonError
from ...inference import InferInput, InferRequest, InferResponse, RequestedOutput
from ...protocol.dtypes import BY_NUMPY, from_numpy
from ...repository.ensemble_graph import Step
from ...runtime import fastpath
from ...runtime.kernel import Reply

log = logging.getLogger(__name__)

# an ensemble tensor its step's model answered without (a Python model may leave an output out): Triton
# core records it as a null tensor; a step reading it gets no such input, and the ensemble's response
# leaves it out ("Composing models did not output tensor X", a verbose log line: Triton's L0_simple_ensemble)
ABSENT = InferInput("", None, (), None)  # type: ignore[arg-type]

MEMO_SIZE = 1024  # (step, validator, input signature) entries per ensemble version
_TYPE_AND_SHAPE = attrgetter("dtype", "shape")  # an input's part of the signature


class StepReply(Reply[InferResponse]):
    """A step's reply: one completed while its step starts (the model ran inline) is read by the ensemble
    when ``enqueue`` returns; otherwise the ensemble gives it :meth:`then`, called as soon as it completes
    (the completing stack, hub thread): the ensemble's actor queues the answer when it is busy, so the
    stack does not grow per step."""

    __slots__ = ("_then",)

    def __init__(self) -> None:
        super().__init__()
        self._then: Callable[[Reply[InferResponse]], None] | None = None

    def then(self, then: Callable[[Reply[InferResponse]], None]) -> None:
        """Call ``then(self)`` when completed (the reply is not yet: the caller checked ``ready()``)."""
        self._then = then

    def set(self, value: InferResponse) -> None:
        if not self._done:
            super().set(value)
            if self._then is not None:
                self._then(self)

    def fail(self, error: BaseException) -> None:
        if not self._done:
            super().fail(error)
            if self._then is not None:
                self._then(self)


class StepPlan:
    """One step's fixed parts: its requested outputs and its output map (built once per version)."""

    __slots__ = ("step", "requested", "out_map", "reads", "handle", "version", "runner")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.reads = tuple(tensor for _, tensor in step.inputs)  # the ensemble tensors it waits for
        self.requested = tuple(RequestedOutput(name) for name, _ in step.outputs)
        self.out_map = dict(step.outputs)
        # the model handle a chain's step was last routed with, and the version it resolved to
        # (ensemble_chain.py): the same handle resolves the same way, until its model changes
        self.handle: Any = None
        self.version: Any = None
        self.runner: Any = None  # the version's ``step_runner()``: runs the step on this stack, if it can

    def inputs(self, tensors: dict[str, InferInput]) -> dict[str, InferInput]:
        """The step's inputs under its model's names: the same arrays; a tensor whose name already
        matches is handed on as it is."""
        out = {}
        for name, tensor in self.step.inputs:
            t = tensors[tensor]
            if t is not ABSENT:
                out[name] = t if t.name == name else fastpath.new_tuple(InferInput, (name, t.dtype, t.shape, t.data))
        return out

    def mapped(self, response: InferResponse) -> dict[str, InferInput]:
        """The step's outputs under their ensemble names, as tensors the next steps take as they are."""
        by_name = self.out_map
        out: dict[str, InferInput] = {}
        for name, data in response.outputs:
            tensor = by_name.get(name)
            if tensor is None:
                continue
            dtype = BY_NUMPY.get(data.dtype) or from_numpy(data.dtype)  # the usual types without a call
            if dtype is None:
                raise TritonError.internal(
                    f"output '{name}' of model '{self.step.model}' has an unsupported type {data.dtype}")
            out[tensor] = fastpath.new_tuple(InferInput, (tensor, dtype, data.shape, data))
        if len(out) < len(by_name):  # an output left out: the step is done with it all the same (ABSENT)
            for tensor in by_name.values():
                out.setdefault(tensor, ABSENT)
        return out


def checked_batch(memo: fastpath.BoundedCache[Any, int], index: int, version: Any, request: InferRequest) -> int:
    """The batch size ``version``'s validator gives ``request`` (raising what it raises), looked up first
    in ``memo`` by step, validator and input signature (a miss always while fast paths are off): the types
    and shapes in the step's input order (its input names are the step's, the same each time)."""
    validator = version.validator
    key = (index, validator, *map(_TYPE_AND_SHAPE, request.inputs.values()))  # in C: no loop of ours
    batch = memo.get(key)
    if batch is None:
        batch = validator.check(request)
        memo.put(key, batch)
    return batch


def reshaped_step(memo: fastpath.BoundedCache[Any, int], index: int, version: Any, request: InferRequest,
                  refused: TritonError) -> tuple[InferRequest, int]:
    """After :func:`checked_batch` ``refused`` a step's request: the request reshaped by its validator's
    ``batch_reshaped`` (one side of the step batches, the other does not) and its batch size, or ``refused``
    again when no reshape applies. Only a refused request pays for looking (an ensemble that batches on one
    side only pays it every time)."""
    shaped = version.validator.batch_reshaped(request.inputs)
    if shaped is request.inputs:
        raise refused
    request = request._replace(inputs=shaped)
    return request, checked_batch(memo, index, version, request)


def answer_outputs(names: Iterable[str], tensors: dict[str, InferInput], wanted: Any) -> list[tuple[str, Any]]:
    """The ensemble's response: its outputs (``names``) that are ``wanted`` (None: all), those its steps
    answered without (:data:`ABSENT`) left out and logged as Triton logs them (verbose)."""
    outputs = []
    for name in names:
        if wanted is None or name in wanted:
            t = tensors[name]
            if t is ABSENT:
                log.debug("Composing models did not output tensor %s", name)
            else:
                outputs.append((name, t.data))
    return outputs

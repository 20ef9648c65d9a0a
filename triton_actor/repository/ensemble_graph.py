"""The graph of an ``ensemble`` model: its steps, which tensor feeds which step, and Triton's checks of it.

Pure (no actors, no I/O): the model actor calls :func:`check_scheduling` when it validates an ensemble's
config, :func:`check_composing` when the composing models are loaded (their configs known), and the
ensemble scheduler runs requests along the :class:`Graph` it gets back. The repository actor reads
:func:`dependencies` to load an ensemble after its composing models, and :func:`find_cycle` to refuse
ensembles that contain each other.

Error texts are Triton core's (``model_config_utils.cc`` ``ValidateEnsembleSchedulingConfig``,
``ensemble_utils.cc`` ``ValidateTensorMapping``, ``model_repository_manager.cc`` ``CheckNode``), all
INVALID_ARG, so the load API answers 400 and the index shows them as the model's ``reason``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import TritonError
from .config import ModelConfig, data_type_name

ENSEMBLE = "ensemble"


@dataclass(frozen=True, slots=True)
class Step:
    """One step: run ``model`` (``version`` -1 = latest) on ``inputs`` (model input → ensemble tensor),
    map its ``outputs`` (model output → ensemble tensor)."""

    index: int
    model: str
    version: int
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Graph:
    """The checked data flow of one ensemble (immutable, shared by every request)."""

    name: str
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]  # ensemble input names, config order
    outputs: tuple[str, ...]  # ensemble output names, config order
    consumers: Mapping[str, tuple[int, ...]]  # ensemble tensor → indices of the steps that read it


def is_ensemble(cfg: ModelConfig) -> bool:
    return cfg.platform == ENSEMBLE


def _bad(message: str) -> TritonError:
    return TritonError.invalid_arg(message)


def check_scheduling(cfg: ModelConfig) -> Graph:
    """The config-only checks of an ensemble (Triton's ``ValidateEnsembleSchedulingConfig``): required
    fields, a tensor produced twice, unused inputs, unwritten outputs, unused tensors and cycles (a
    cycle leaves its tensors never ready, which Triton reports as an unused tensor)."""
    name = cfg.name
    if cfg.HasField("ensemble_scheduling") and not is_ensemble(cfg):
        raise _bad(f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE}")
    if not cfg.HasField("ensemble_scheduling"):
        raise _bad(f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE}")
    if cfg.instance_group:
        raise _bad(f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        raise _bad(f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        raise _bad(f"model_warmup can not be specified for ensemble '{name}'")
    if not cfg.ensemble_scheduling.step:
        raise _bad(f"must specify 'step' for ensemble '{name}'")
    steps = _steps(cfg)
    produced: set[str] = set()
    consumers: dict[str, list[int]] = {}
    for step in steps:
        for _, tensor in step.outputs:
            if tensor in produced:
                raise _bad(f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                           f"'{name}' step {step.index}")
            produced.add(tensor)
        for _, tensor in step.inputs:
            consumers.setdefault(tensor, []).append(step.index)
    known = produced | set(consumers)
    inputs = tuple(i.name for i in cfg.input)
    outputs = tuple(o.name for o in cfg.output)
    for i in inputs:
        if i not in known:
            raise _bad(f"ensemble input '{i}' for ensemble {name}' is not used")
    ready = _ready_tensors(steps, inputs)
    for o in outputs:
        if o not in known:
            raise _bad(f"ensemble output '{o}' for ensemble {name}' is not used")
        if o not in ready:
            raise _bad(f"output '{o}' for ensemble '{name}' is not written{_unconnected(o, steps, ready)}")
    for tensor in sorted(known):
        if tensor in outputs:
            continue
        if tensor not in ready or tensor not in consumers:
            raise _bad(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")
    return Graph(name, steps, inputs, outputs, {t: tuple(s) for t, s in consumers.items()})


def _steps(cfg: ModelConfig) -> tuple[Step, ...]:
    out = []
    for idx, s in enumerate(cfg.ensemble_scheduling.step):
        where = f"in step {idx} of ensemble '{cfg.name}'"
        if not s.model_name:
            raise _bad(f"must specify 'model_name' {where}")
        if not s.input_map:
            raise _bad(f"must specify 'input_map' {where}")
        if not s.output_map:
            raise _bad(f"must specify 'output_map' {where}")
        out.append(Step(idx, s.model_name, int(s.model_version), tuple(sorted(s.input_map.items())),
                        tuple(sorted(s.output_map.items()))))
    return tuple(out)


def _ready_tensors(steps: tuple[Step, ...], inputs: tuple[str, ...]) -> set[str]:
    """The tensors the data flow can produce from the ensemble inputs (steps run once all inputs are ready)."""
    ready = set(inputs)
    pending = deque(steps)
    stalled = 0
    while pending and stalled < len(pending):
        step = pending.popleft()
        if all(t in ready for _, t in step.inputs):
            ready.update(t for _, t in step.outputs)
            stalled = 0
        else:
            pending.append(step)
            stalled += 1
    return ready


def _unconnected(output: str, steps: tuple[Step, ...], ready: set[str]) -> str:
    """Triton's hint for an unwritten output: follow the first not-ready input of each producing step
    back to a tensor nothing produces (a cycle stops where it comes round)."""
    producer = {t: step for step in steps for _, t in step.outputs}
    last, seen = output, set()
    step = producer.get(output)
    while step is not None:
        pending = [t for _, t in step.inputs if t not in ready and t not in seen]
        if not pending:
            break
        last = pending[0]
        seen.add(last)
        step = producer.get(last)
    if last == output:
        return ""
    return f": at least one of its depending tensors, '{last}', is not connected"


def dependencies(cfg: ModelConfig) -> tuple[str, ...]:
    """The composing models an ensemble names, in step order, each once (empty for other models)."""
    if not is_ensemble(cfg):
        return ()
    return tuple(dict.fromkeys(s.model_name for s in cfg.ensemble_scheduling.step if s.model_name))


def find_cycle(name: str, depends: Callable[[str], tuple[str, ...]]) -> str | None:
    """Triton's text for an ensemble that (through other ensembles) contains itself, else None."""
    path: list[str] = [name]

    def visit(node: str, seen: set[str]) -> str | None:
        for dep in depends(node):
            if dep == name:
                return f"circular dependency between ensembles: {name} -> ... -> {node} -> {name}"
            if dep in seen:
                continue
            seen.add(dep)
            path.append(dep)
            found = visit(dep, seen)
            path.pop()
            if found:
                return found
        return None

    return visit(name, {name})


@dataclass(frozen=True, slots=True)
class Composing:
    """What the check needs to know about one composing model when the ensemble loads."""

    config: ModelConfig | None  # None: not in any repository, or never loaded
    ready_versions: tuple[int, ...] = ()
    reason: str = ""  # why it has no ready version


def check_composing(cfg: ModelConfig, graph: Graph, models: Mapping[str, Composing]) -> bool:
    """The checks that need the composing models (Triton's ``CheckNode`` and ``ValidateEnsembleConfig``):
    every one available with the versions the steps ask for, batch sizes, each tensor's data type and
    shape agreeing between its producer and its consumers, and the streams of decoupled steps. Returns
    whether the ensemble is decoupled (Triton sets its ``model_transaction_policy`` from that)."""
    name = cfg.name
    missing = [m for m in dependencies(cfg) if models.get(m) is None]
    if missing:
        raise _bad(f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}")
    for m in dependencies(cfg):
        if models[m].config is None:  # it failed before its config was known
            raise _bad(f"ensemble '{name}' depends on '{m}' which is not valid. Model '{m}' failed with error: "
                       f"{models[m].reason}")
    for step in graph.steps:
        info = models[step.model]
        if not info.ready_versions:
            detail = f" Model '{step.model}' loading failed with error: {info.reason}" if info.reason else ""
            raise _bad(f"ensemble '{name}' depends on '{step.model}' which has no loaded version.{detail}")
        if step.version >= 0 and step.version not in info.ready_versions:
            raise _bad(f"ensemble '{name}' depends on '{step.model}' whose required version {step.version} "
                       "is not loaded.")
    tensors: dict[str, _Tensor] = {}
    batching = cfg.max_batch_size > 0
    for t in (*cfg.input, *cfg.output):
        tensors[t.name] = _Tensor(name, batching, t.data_type, tuple(t.reshape.shape if t.HasField("reshape") else t.dims))
    for step in graph.steps:
        composing = models[step.model].config
        assert composing is not None
        if composing.max_batch_size != 0 and composing.max_batch_size < cfg.max_batch_size:
            raise _bad(f"ensemble {name} allows maximum batch size {cfg.max_batch_size}, but it contains model "
                       f"{step.model} which only allows maximum batch size to be {composing.max_batch_size}")
        _check_mapping(name, step, composing, tensors)
    return _decoupled(cfg, graph, models)


def _decoupled(cfg: ModelConfig, graph: Graph, models: Mapping[str, Composing]) -> bool:
    """Triton's walk of the data flow (``ValidateEnsembleConfig``): each response of a decoupled step
    starts a stream of its own (a new label on its outputs, shared by them); a step, or the ensemble's
    outputs taken together, must not receive tensors of two different streams, whose responses could
    not be paired. True when some step is decoupled: the ensemble is then decoupled itself."""
    owner = dict.fromkeys((*graph.inputs, *graph.outputs), cfg.name)  # the model named in the error
    producer: dict[str, Step] = {}
    for step in graph.steps:
        composing = models[step.model].config
        mapped = dict(step.inputs)
        order = [mapped[i.name] for i in composing.input if i.name in mapped] if composing is not None else []
        for tensor in (*order, *(t for _, t in step.inputs), *(t for _, t in step.outputs)):
            owner.setdefault(tensor, step.model)
        for _, tensor in step.outputs:
            producer[tensor] = step
    labels = dict.fromkeys(graph.inputs, 0)
    step_labels: dict[int, int] = {}
    fresh = 0
    pending = [t for t in producer if t not in labels]
    while pending:
        ready = [t for t in pending if all(p in labels for _, p in producer[t].inputs)]
        if not ready:
            break  # never ready: check_scheduling refused that graph already
        for tensor in ready:
            pending.remove(tensor)
            step = producer[tensor]
            _same_stream(cfg.name, owner[tensor], [labels[p] for _, p in step.inputs])
            if step.index not in step_labels:
                composing = models[step.model].config
                if composing is not None and composing.model_transaction_policy.decoupled:
                    fresh += 1
                    step_labels[step.index] = fresh
                else:
                    step_labels[step.index] = labels[step.inputs[0][1]]
            labels[tensor] = step_labels[step.index]
    _same_stream(cfg.name, cfg.name, [labels[o] for o in graph.outputs if o in labels])
    return fresh != 0


def _same_stream(ensemble: str, model: str, labels: list[int]) -> None:
    if len(set(labels)) > 1:
        raise _bad(f"in ensemble {ensemble}, step of model '{model}' receives inputs originated from "
                   "different decoupled models")


@dataclass(frozen=True, slots=True)
class _Tensor:
    model: str
    batching: bool
    dtype: int
    dims: tuple[int, ...]

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _consistent(prefix: str, lhs: _Tensor, rhs: _Tensor) -> None:
    if lhs.dtype != rhs.dtype:
        raise _bad(f"{prefix}inconsistent data type: {data_type_name(lhs.dtype)} is inferred from model {lhs.model} "
                   f"while {data_type_name(rhs.dtype)} is inferred from model {rhs.model}")
    # a non-batching model's [-1, d...] matches a batching one's [d...] (Triton compares full dims too)
    if not _dims_agree(lhs.dims, rhs.dims) and not _dims_agree(lhs.full_dims, rhs.full_dims):
        raise _bad(f"{prefix}inconsistent shape: {_dims_text(lhs.full_dims)} is inferred from model {lhs.model} "
                   f"while {_dims_text(rhs.full_dims)} is inferred from model {rhs.model}")


def _check_mapping(ensemble: str, step: Step, composing: ModelConfig, tensors: dict[str, _Tensor]) -> None:
    batching = composing.max_batch_size > 0
    model_inputs = {i.name: i for i in composing.input}
    mapped = dict(step.inputs)
    for model_input, tensor in step.inputs:
        if model_input not in model_inputs:
            raise _bad(f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to non-existing input "
                       f"{model_input} in model {step.model}")
    for i in composing.input:
        if i.name not in mapped:
            if i.optional:
                continue
            raise _bad(f"in ensemble {ensemble}, input {i.name} in model {step.model} is not mapped to any "
                       "ensemble tensors")
        _merge(ensemble, mapped[i.name], _Tensor(step.model, batching, i.data_type, tuple(i.dims)), tensors)
    model_outputs = {o.name: o for o in composing.output}
    for model_output, tensor in step.outputs:
        o = model_outputs.get(model_output)
        if o is None:
            raise _bad(f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from non-existing output "
                       f"{model_output} in model {step.model}")
        _merge(ensemble, tensor, _Tensor(step.model, batching, o.data_type, tuple(o.dims)), tensors)


def _merge(ensemble: str, name: str, tensor: _Tensor, tensors: dict[str, _Tensor]) -> None:
    known = tensors.get(name)
    if known is None:
        tensors[name] = tensor
    else:
        _consistent(f"in ensemble {ensemble}, ensemble tensor {name}: ", known, tensor)

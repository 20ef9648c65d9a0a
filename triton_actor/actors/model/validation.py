"""Checks a request against its model's config before it is queued (Triton core ``InferenceRequest::Normalize``).

Built once per loaded model version; ``check`` runs on the hot path, so it is a few dict lookups, and
with fast paths on (:mod:`...runtime.fastpath`) one: a request whose requested outputs and input names,
types and shapes were accepted before gets the same batch size (the check reads nothing else; a refused
signature is never remembered, so its error, which names the request, is raised each time).
Messages are Triton's, prefixed with ``[request id: <id>] ``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import TritonError
from ...inference import InferInput, InferRequest
from ...protocol.dtypes import BY_ENUM_VALUE, DType
from ...repository.config import ModelConfig
from ...runtime import fastpath

# accepted signatures remembered per version: a client that sends a new shape each time (a dynamic dim)
# empties the memo every MEMO_SIZE requests and pays the full check meanwhile, as without it
MEMO_SIZE = 256


@dataclass(frozen=True, slots=True)
class _Spec:
    dtype: DType
    dims: tuple[int, ...]
    optional: bool
    ragged: bool


def _shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class RequestValidator:
    """Per model version: known inputs/outputs, batching, and the checks on one request."""

    __slots__ = ("model", "max_batch_size", "inputs", "outputs", "required", "_accepted")

    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {
            i.name: _Spec(BY_ENUM_VALUE[i.data_type], tuple(i.dims), i.optional, i.allow_ragged_batch)
            for i in config.input
        }
        self.outputs = frozenset(o.name for o in config.output)
        self.required = frozenset(n for n, s in self.inputs.items() if not s.optional)
        self._accepted: fastpath.BoundedCache[tuple[object, ...], int] = fastpath.BoundedCache(
            f"accepted signatures of {self.model}", MEMO_SIZE)

    def check(self, request: InferRequest) -> int:
        """Raise INVALID_ARG on the first problem; return the request's batch size (1 without batching)."""
        if not fastpath.enabled:  # read here, not when built: validators outlive a switch (tests, module constants)
            return self._check(request)
        signature: list[object] = [request.outputs]  # what the check reads (outputs: hashable named tuples)
        for name, t in request.inputs.items():
            signature += (name, t.dtype, t.shape)
        key = tuple(signature)
        batch = self._accepted.get(key)
        if batch is None:
            batch = self._check(request)
            self._accepted.put(key, batch)
        return batch

    def _check(self, request: InferRequest) -> int:
        model = self.model
        if request.outputs is not None:
            seen: set[str] = set()
            for out in request.outputs:
                if out.name in seen:  # Triton core's AddOriginalRequestedOutput (core PR #493), every front end
                    raise TritonError.invalid_arg(f"{_prefix(request)}output '{out.name}' already exists in request")
                seen.add(out.name)
                if out.name not in self.outputs:
                    raise TritonError.invalid_arg(f"unexpected inference output '{out.name}' for model '{model}'")
        given = request.inputs
        for name in given:
            if name not in self.inputs:
                raise TritonError.invalid_arg(f"{_prefix(request)}unexpected inference input '{name}' for model '{model}'")
        if not self.required.issubset(given.keys()):
            missing = [n for n in self.inputs if n in self.required and n not in given]  # config order
            total = len(self.inputs)
            expected = (f"{total} inputs" if total == len(self.required)
                        else f"number of inputs between {len(self.required)} and {total}")
            raise TritonError.invalid_arg(
                f"{_prefix(request)}expected {expected} but got {len(given)} inputs for model '{model}'. "
                f"Got input(s) {_names(list(given))}, but missing required input(s) {_names(missing)}. "
                "Please provide all required input(s)."
            )
        batch = 1
        mbs = self.max_batch_size
        if mbs > 0:
            first = next(iter(given.values()), None)
            if first is not None:
                if not first.shape:
                    raise TritonError.invalid_arg(
                        f"{_prefix(request)}input '{first.name}' has no shape but model requires batch dimension for '{model}'"
                    )
                batch = first.shape[0]
                for t in given.values():
                    if not t.shape or t.shape[0] != batch:
                        raise TritonError.invalid_arg(
                            f"{_prefix(request)}input '{t.name}' batch size does not match other inputs for '{model}'"
                        )
                if batch < 1 or batch > mbs:
                    raise TritonError.invalid_arg(f"{_prefix(request)}inference request batch-size must be <= {mbs} for '{model}'")
        for name, t in given.items():
            spec = self.inputs[name]
            if t.dtype is not spec.dtype:
                raise TritonError.invalid_arg(
                    f"{_prefix(request)}inference input '{name}' data-type is '{t.dtype.wire}', "
                    f"but model '{model}' expects '{spec.dtype.wire}'"
                )
            shape = t.shape[1:] if mbs > 0 else t.shape
            if not _matches(shape, spec.dims):
                expected = ((-1,) if mbs > 0 else ()) + spec.dims
                note = (
                    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
                    "prepended to each input shape. If you want to specify the full shape including the batch dim "
                    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
                    "docs for more info on max_batch_size."
                    if mbs > 0
                    else ""
                )
                raise TritonError.invalid_arg(
                    f"{_prefix(request)}unexpected shape for input '{name}' for model '{model}'. "
                    f"Expected {_shape_text(expected)}, got {_shape_text(t.shape)}. {note}"
                )
        return batch

    def batch_reshaped(self, inputs: dict[str, InferInput]) -> dict[str, InferInput]:
        """``inputs`` as this model takes them from an ensemble step where one side batches and the other
        does not (Triton core's ``EnsembleContext::ReshapeTensorDims``): a batching model gets a tensor whose
        shape is its config dims with a batch of 1 put in front; a model that does not batch gets a tensor
        whose shape is not its dims with a leading 1 taken off. (Triton decides by where the tensor came
        from; this decides by its shape, which agrees wherever Triton serves the request.) Views, no copy;
        ``inputs`` itself when nothing changes."""
        batching = self.max_batch_size > 0
        changed = None
        for name, t in inputs.items():
            spec = self.inputs.get(name)
            if spec is None:
                continue
            if batching:
                if not _matches(t.shape, spec.dims):
                    continue
                shape = (1, *t.shape)
            else:
                if not t.shape or t.shape[0] != 1 or _matches(t.shape, spec.dims):
                    continue
                shape = t.shape[1:]
            if changed is None:
                changed = dict(inputs)
            changed[name] = InferInput(name, t.dtype, shape, t.data.reshape(shape))
        return inputs if changed is None else changed


def _prefix(request: InferRequest) -> str:
    """Triton's ``LogRequest()`` prefix; built only when a check fails."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    for got, want in zip(shape, dims, strict=True):
        if want != -1 and got != want:
            return False
    return True


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"

"""The tensors the sequence batcher adds to a request: control inputs and implicit state (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/batcher.md, https://github.com/triton-inference-server/server/blob/main/docs/user_guide/implicit_state_management.md).

Pure functions of the config, built once per loaded version (:meth:`SequenceTensors.from_config`, which
also checks the ``sequence_batching`` block with Triton's rules and raises INVALID_ARG at load). Used by
the version's sequence scheduler, in its greenlet.

* Controls: the client never sends them. Per request the batcher adds START (first request of the
  sequence), END (last), READY (the slot holds a request this execution) and CORRID (the id), as
  ``[1, 1]`` tensors when ``max_batch_size`` > 0 (``[1]`` otherwise) in the data type the config names;
  a string id is a BYTES tensor (``TYPE_STRING``).
* Implicit state (``state [...]``): output ``output_name`` of a request is fed back as input
  ``input_name`` of the next request of the same sequence; a START gets the ``initial_state`` (zeros,
  or the raw bytes of ``<model dir>/initial_state/<data_file>``), else zeros. State outputs that the
  config does not list as outputs are not returned to the client. Triton implements this in the
  ONNX Runtime, PyTorch and TensorRT backends; here the scheduler does it, so every backend has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import TritonError
from ...inference import InferInput, InferResponse
from ...protocol.dtypes import BY_ENUM_VALUE, DType
from ...repository import layout
from .sequence_slots import SEQUENCE_END, SEQUENCE_START

START, READY, END, CORRID = 0, 1, 2, 3
_KIND_NAMES = {START: "CONTROL_SEQUENCE_START", READY: "CONTROL_SEQUENCE_READY", END: "CONTROL_SEQUENCE_END",
               CORRID: "CONTROL_SEQUENCE_CORRID"}
_CORRID_TYPES = frozenset({"TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING"})


@dataclass(frozen=True, slots=True)
class _Control:
    name: str
    kind: int
    dtype: DType
    values: tuple[Any, Any] = (0, 1)  # (false, true); unused for CORRID


@dataclass(frozen=True, slots=True)
class _State:
    input_name: str
    output_name: str
    dtype: DType
    initial: np.ndarray  # without the batch dimension


@dataclass(frozen=True, slots=True)
class SequenceTensors:
    controls: tuple[_Control, ...]
    states: tuple[_State, ...]
    batched: bool
    outputs: frozenset[str]  # the config's outputs: state outputs outside it are not returned

    @classmethod
    def from_config(cls, config: Any, model_dir: Path) -> SequenceTensors:
        sb = config.sequence_batching
        controls, seen = [], set()
        for entry in sb.control_input:
            for c in entry.control:
                controls.append(_control(config.name, entry.name, c))
                if c.kind in seen:
                    raise TritonError.invalid_arg(
                        f"sequence batching specifies multiple {_KIND_NAMES[c.kind]} tensors for {config.name}")
                seen.add(c.kind)
        states = tuple(_state(config.name, s, model_dir) for s in sb.state)
        return cls(tuple(controls), states, config.max_batch_size > 0, frozenset(o.name for o in config.output))

    def controls_for(self, corr_id: int | str, flags: int, ready: bool) -> dict[str, InferInput]:
        """The control tensors of one request (``ready`` False: an empty slot's null request)."""
        shape = (1, 1) if self.batched else (1,)
        out = {}
        for c in self.controls:
            if c.kind == CORRID:
                if c.dtype.numpy == np.object_:
                    array = np.array([str(corr_id).encode()], dtype=np.object_).reshape(shape)
                else:  # a string id cannot be a number (Triton sends garbage there: 0 here); wider ids wrap
                    number = 0 if isinstance(corr_id, str) else corr_id % (1 << 64)
                    array = np.array([number], dtype=np.uint64).astype(c.dtype.numpy).reshape(shape)
            else:
                on = {START: flags & SEQUENCE_START, END: flags & SEQUENCE_END, READY: ready}[c.kind]
                array = np.array([c.values[1] if on else c.values[0]], dtype=c.dtype.numpy).reshape(shape)
            out[c.name] = InferInput(c.name, c.dtype, shape, array)
        return out

    def state_inputs(self, saved: dict[str, np.ndarray] | None) -> dict[str, InferInput]:
        """The state inputs of one request: what the sequence's last response left, else the initial state."""
        out = {}
        for s in self.states:
            array = saved.get(s.input_name) if saved else None
            if array is None:
                array = s.initial[np.newaxis] if self.batched else s.initial
            out[s.input_name] = InferInput(s.input_name, s.dtype, tuple(array.shape), array)
        return out

    def take_states(self, response: InferResponse) -> tuple[InferResponse, dict[str, np.ndarray]]:
        """Split a response into what the client sees and the state the next request gets."""
        if not self.states:
            return response, {}
        by_output = {s.output_name: s.input_name for s in self.states}
        saved = {by_output[name]: np.array(a, copy=True) for name, a in response.outputs if name in by_output}
        kept = [(n, a) for n, a in response.outputs if n not in by_output or n in self.outputs]
        return InferResponse(kept, response.parameters), saved


def _control(model: str, name: str, c: Any) -> _Control:
    kind = int(c.kind)
    lists = [(f, getattr(c, f)) for f in ("int32_false_true", "fp32_false_true", "bool_false_true") if len(getattr(c, f))]
    if kind == CORRID:
        dtype_name = BY_ENUM_VALUE[c.data_type].enum_name if c.data_type in BY_ENUM_VALUE else "TYPE_INVALID"
        if lists or dtype_name not in _CORRID_TYPES:
            raise TritonError.invalid_arg(
                f"sequence batching control tensor '{name}' for {model}: CONTROL_SEQUENCE_CORRID must use data_type "
                f"TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING and no false/true values")
        return _Control(name, kind, BY_ENUM_VALUE[c.data_type])
    if len(lists) != 1 or len(lists[0][1]) != 2:
        raise TritonError.invalid_arg(
            f"sequence batching control tensor '{name}' for {model}: {_KIND_NAMES.get(kind, kind)} must specify "
            "exactly one of int32_false_true, fp32_false_true or bool_false_true, with 2 values")
    field_name, values = lists[0]
    dtype = BY_ENUM_VALUE[{"int32_false_true": 8, "fp32_false_true": 11, "bool_false_true": 1}[field_name]]
    return _Control(name, kind, dtype, (values[0], values[1]))


def _state(model: str, s: Any, model_dir: Path) -> _State:
    dtype = BY_ENUM_VALUE.get(s.data_type)
    if dtype is None or dtype.numpy is None or not s.input_name or not s.output_name:
        raise TritonError.invalid_arg(f"sequence batching state for {model} needs input_name, output_name and a data_type")
    dims = [max(int(d), 1) for d in s.dims]  # a variable dim starts at 1
    initial = np.zeros(dims, dtype=dtype.numpy)
    for init in s.initial_state:
        shape = [int(d) for d in init.dims] or dims
        if init.WhichOneof("state_data") == "data_file":
            path = model_dir / "initial_state" / init.data_file
            if not layout.contained(model_dir / "initial_state", path) or not path.is_file():
                # a config names a file of the model's own initial_state folder, nothing else on the host
                raise TritonError.invalid_arg(f"initial state '{init.name}' of {model}: data_file "
                                              f"'{init.data_file}' is not a file in the model's initial_state folder")
            want = int(np.prod(shape)) * np.dtype(dtype.numpy).itemsize
            if path.stat().st_size != want:
                raise TritonError.invalid_arg(f"initial state '{init.name}' of {model}: data_file "
                                              f"'{init.data_file}' holds {path.stat().st_size} bytes, dims "
                                              f"{shape} need {want}")
            try:
                initial = np.frombuffer(path.read_bytes(), dtype=dtype.numpy).reshape(shape).copy()
            except (OSError, ValueError) as e:
                raise TritonError.invalid_arg(f"failed to read initial state '{init.name}' of {model}: {e}") from None
        else:
            initial = np.zeros(shape, dtype=dtype.numpy)
    return _State(s.input_name, s.output_name, dtype, initial)

"""Triton's JSON trace-file entries (``docs/user_guide/trace.md``, "JSON Trace Output"): pure functions.

A trace file is one JSON array. Each traced request contributes a header object ``{"id", "model_name",
"model_version"[, "request_id"]}``, one ``{"id", "timestamps": [{"name", "ns"}]}`` object per activity
(Triton writes one timestamp per object), and at level TENSORS one ``{"id", "activity", "tensor"}``
object per input (``TENSOR_QUEUE_INPUT``) and output (``TENSOR_BACKEND_OUTPUT``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .dtypes import from_numpy

# The request activities of Triton core's TRITONSERVER_InferenceTraceActivity, in the order they happen.
STAGES = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
          "COMPUTE_END", "REQUEST_END")


def header(trace_id: int, model: str, version: int, request_id: str, parent_id: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": trace_id, "model_name": model, "model_version": version}
    if request_id:
        entry["request_id"] = request_id
    if parent_id:
        entry["parent_id"] = parent_id
    return entry


def timestamps(trace_id: int, stamps: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """One object per activity, as Triton writes them."""
    return [{"id": trace_id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in stamps]


def stage_times(start_ns: int, dispatch_ns: int, end_ns: int, timings: tuple[int, int, int],
                respond_ns: int) -> list[tuple[str, int]]:
    """The seven request activities from what the scheduler knows about one executed request.

    ``start_ns`` is when it was queued (REQUEST_START and QUEUE_START: the validation between them is not
    timed apart), ``dispatch_ns`` when its batch was handed to an instance (COMPUTE_START), ``end_ns`` when
    the batch's completion reached the scheduler (COMPUTE_END), ``timings`` the instance's compute input,
    infer and output durations, ``respond_ns`` when the reply was completed (REQUEST_END). The compute
    stages are laid out backwards from COMPUTE_END and clamped, so the stamps never go back in time; the
    hop to the instance's thread counts as compute input.
    """
    ci, infer, co = timings
    output_start = max(dispatch_ns, end_ns - co)
    input_end = max(dispatch_ns, min(dispatch_ns + ci, output_start), output_start - infer)
    return list(zip(STAGES, (start_ns, start_ns, dispatch_ns, input_end, output_start, end_ns,
                             max(end_ns, respond_ns)), strict=True))


def tensor(trace_id: int, activity: str, name: str, array: np.ndarray) -> dict[str, Any]:
    """A TENSORS-level entry: data as comma-separated values, shape as comma-separated dims."""
    dt = from_numpy(array.dtype)
    flat = array.ravel().tolist()
    data = ",".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat)
    return {"id": trace_id, "activity": activity,
            "tensor": {"name": name, "data": data, "shape": ",".join(str(d) for d in array.shape),
                       "dtype": dt.wire if dt is not None else str(array.dtype)}}

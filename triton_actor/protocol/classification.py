"""The classification extension: replace an output with its top-N ``"value:index[:label]"`` strings (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_classification.md)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import TritonError
from ..inference import InferRequest, InferResponse, RequestedOutput
from .dtypes import from_numpy


def _fmt(value: object) -> str:
    # Triton formats with C++ std::to_string: floats get six decimals, integers none.
    if isinstance(value, float | np.floating):
        return f"{float(value):.6f}"
    return str(int(value))  # type: ignore[call-overload]


# Triton's classification: integers and FP32/FP64 only, and at most this many elements in the output
# (server classification.cc kMaxClassificationElements: "pathological memory / CPU usage" otherwise)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
MAX_ELEMENTS = 1_000_000


def classify(array: np.ndarray, count: int, labels: list[str] | None, batching: bool) -> np.ndarray:
    """Top-``count`` per batch row (batching models) or over the whole tensor, as a BYTES array; Triton's
    INVALID_ARG for a type it does not classify (BYTES, BOOL, FP16, BF16) or a tensor over MAX_ELEMENTS."""
    if array.dtype.kind not in "ui" and array.dtype not in _FLOATS:
        dtype = from_numpy(array.dtype)
        raise TritonError.invalid_arg("class result not available for output due to unsupported type "
                                      f"'{dtype.wire if dtype is not None else array.dtype}'")
    if array.size > MAX_ELEMENTS:
        raise TritonError.invalid_arg("classification output tensor too large")
    rows = array.reshape(array.shape[0], -1) if batching and array.ndim > 0 else array.reshape(1, -1)
    k = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        # stable sort on the negated values: ties keep the lower index first, as std::sort on pairs does
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, idx in enumerate(order):
            text = f"{_fmt(row[idx].item())}:{idx}"
            if labels is not None and idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode()
    return out if batching else out.reshape(k)


def selected_outputs(request: InferRequest, response: InferResponse, labels: dict[str, list[str]],
                     batching: bool) -> Iterator[tuple[str, np.ndarray, RequestedOutput | None]]:
    """The outputs a response carries, in the model's order: every one when the request named none,
    else the named ones (classified where asked), each with its request entry (both front ends)."""
    wanted = None if request.outputs is None else {o.name: o for o in request.outputs}
    for name, array in response.outputs:
        spec = None
        if wanted is not None:
            spec = wanted.get(name)
            if spec is None:
                continue
            if spec.classification:
                array = classify(array, spec.classification, labels.get(name), batching)
        yield name, array, spec

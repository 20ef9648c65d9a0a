"""The request and response values that travel from a front end through the actors and back.

Values are NamedTuples: immutable like frozen dataclasses and about four times cheaper to build,
which matters on the per-request path. Front ends build an :class:`InferRequest` (tensors are numpy arrays viewing the request body, no
copies); backends answer each request with an :class:`InferResponse` or a ``TritonError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:  # core values import no layer above them; protocol's dtypes table is one
    from .protocol.dtypes import DType


class InferInput(NamedTuple):
    """One input tensor as the client sent it (``data`` already has ``shape``)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    data: np.ndarray


class RequestedOutput(NamedTuple):
    """One entry of the request's ``outputs``: ``binary`` None means "use the request default";
    ``shm`` is (region name, offset, byte size) when the result goes to system shared memory."""

    name: str
    binary: bool | None = None
    classification: int = 0
    shm: tuple[str, int, int] | None = None  # (region, offset, byte_size): write the output there


class InferRequest(NamedTuple):
    """A decoded inference request. ``model_version`` is -1 for "the highest ready version".

    ``outputs`` is None when the client asked for every output. ``parameters`` holds only the
    parameters forwarded to the model (Triton consumes sequence/priority/timeout itself).
    """

    model_name: str
    model_version: int
    id: str
    inputs: dict[str, InferInput]
    outputs: tuple[RequestedOutput, ...] | None = None
    parameters: dict[str, Any] = {}  # shared default: requests are never mutated
    binary_output: bool = False
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    responses: Any = None  # a ResponseChannel (runtime/bridge.py) when the model is decoupled
    # () -> bool, True once the client cancelled the request (it went away, or reset its call); set by
    # the scheduler, when it hands the request to a backend that looks (``observes_cancellation``)
    is_cancelled: Any = None
    # an OpenTelemetry SpanTrace (observability/otel.py) when the request is traced in that mode: set by
    # the plane where it came in, spawned by an ensemble for each step
    trace: Any = None

    @property
    def requested_output_names(self) -> tuple[str, ...] | None:
        return None if self.outputs is None else tuple(o.name for o in self.outputs)


@dataclass(slots=True)
class InferResponse:
    """What a model produced for one request: output tensors in the model's order."""

    outputs: list[tuple[str, np.ndarray]]
    parameters: dict[str, Any] = field(default_factory=dict)
    # (queue, compute_input, compute_infer, compute_output) ns as the serving scheduler measured them,
    # set on the way out for a caller that adds them up (an ensemble's statistics, as Triton's do)
    timings: tuple[int, int, int, int] | None = None


_SAMPLED = 64  # elements of a BYTES output whose lengths are read; the rest are estimated from them


def response_bytes(item: Any) -> int:
    """Bytes a response's outputs hold (an error or a flags-only final: 0). A BYTES output's elements
    are measured on at most :data:`_SAMPLED` of them, spread over the array (a bound, not an account)."""
    if type(item) is not InferResponse:
        return 0
    total = 0
    try:
        for _name, array in item.outputs:
            if array.dtype.kind != "O":
                total += array.nbytes
            elif array.size:
                flat = array.reshape(-1)
                sample = flat[::max(1, flat.size // _SAMPLED)][:_SAMPLED]
                measured = sum(len(x) if isinstance(x, bytes | str) else 8 for x in sample)
                total += (measured + 8 * len(sample)) * flat.size // len(sample)
    except AttributeError:  # an output that is not an array: its encoder will say so, not the model's send()
        pass
    return total

"""In-process stand-in for Triton's ``triton_python_backend_utils`` module.

Python-backend ``model.py`` files do ``import triton_python_backend_utils as pb_utils``;
the server aliases this module under that top-level name, so the files run unchanged.

Only numpy and the standard library are used.  Things the server provides at run time
are reached through module-level hooks that the server assigns:

* ``_bls_executor(request, decoupled)`` -- runs ``InferenceRequest.exec``; returns an
  ``InferenceResponse`` (or an iterator of them when ``decoupled`` is true).
* ``_bls_async_executor(request, decoupled)`` -- optional; returns an awaitable for
  ``InferenceRequest.async_exec``.  Without it ``async_exec`` runs ``_bls_executor`` in the
  running loop's default executor.
* ``_model_control`` -- an object with ``load_model(name, config, files)``,
  ``unload_model(name, unload_dependents)`` and ``is_model_ready(name, version)``.

Custom metrics are kept in memory; ``_metric_families`` lists every distinct family.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import itertools
import json
import logging
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from typing import Any, ClassVar

import numpy as np

# --------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Values of the core ``TRITONSERVER_MemoryType`` enum.
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# model_config.proto ``DataType`` numbers (``TYPE_STRING`` is the ``BYTES`` type).
TYPE_INVALID = 0
TYPE_BOOL = 1
TYPE_UINT8 = 2
TYPE_UINT16 = 3
TYPE_UINT32 = 4
TYPE_UINT64 = 5
TYPE_INT8 = 6
TYPE_INT16 = 7
TYPE_INT32 = 8
TYPE_INT64 = 9
TYPE_FP16 = 10
TYPE_FP32 = 11
TYPE_FP64 = 12
TYPE_STRING = 13
TYPE_BF16 = 14

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_TRITON_TO_NUMPY: dict[int, type] = {
    TYPE_BOOL: np.bool_,
    TYPE_UINT8: np.uint8,
    TYPE_UINT16: np.uint16,
    TYPE_UINT32: np.uint32,
    TYPE_UINT64: np.uint64,
    TYPE_INT8: np.int8,
    TYPE_INT16: np.int16,
    TYPE_INT32: np.int32,
    TYPE_INT64: np.int64,
    TYPE_FP16: np.float16,
    TYPE_FP32: np.float32,
    TYPE_FP64: np.float64,
    TYPE_STRING: np.object_,
}

# Keyed by ``dtype.type`` so that a lookup is a single dict access.
_NUMPY_TO_TRITON: dict[type, int] = {v: k for k, v in _TRITON_TO_NUMPY.items()}
_NUMPY_TO_TRITON[np.bytes_] = TYPE_STRING
_NUMPY_TO_TRITON[np.str_] = TYPE_STRING

_UINT32 = struct.Struct("<I")

# Module-level hooks assigned by the server (see the module docstring).
_bls_executor: Callable[..., Any] | None = None
_bls_async_executor: Callable[..., Any] | None = None
_model_control: Any = None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class TritonModelException(Exception):
    """Raised by, or to, a model to report a failure (str() is the message)."""

    def message(self) -> str:
        """Return the exception message."""
        return str(self)


class _ArgTypeError(TritonModelException, TypeError):
    """Bad argument type; catchable as TypeError or TritonModelException."""


class _ArgValueError(TritonModelException, ValueError):
    """Bad argument value; catchable as ValueError or TritonModelException."""


class TritonError:
    """Error attached to an ``InferenceResponse``; codes are ``TRITONSERVER_Error_Code``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _CODE_NAMES: ClassVar[dict[int, str]] = {
        0: "UNKNOWN",
        1: "INTERNAL",
        2: "NOT_FOUND",
        3: "INVALID_ARG",
        4: "UNAVAILABLE",
        5: "UNSUPPORTED",
        6: "ALREADY_EXISTS",
        7: "CANCELLED",
    }

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None:
            raise _ArgTypeError("TritonError message must not be None")
        if isinstance(code, bool) or not isinstance(code, (int, np.integer)):
            raise _ArgTypeError(f"TritonError code must be an int, got {type(code).__name__}")
        code = int(code)
        if code not in self._CODE_NAMES:
            raise _ArgValueError(f"unknown TritonError code {code}")
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        """Return the error message."""
        return self._message

    def code(self) -> int:
        """Return the numeric error code (e.g. ``TritonError.INTERNAL``)."""
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return self._message


# --------------------------------------------------------------------------------------
# Data type helpers
# --------------------------------------------------------------------------------------


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """Map a config type string (``"TYPE_FP32"``) to a numpy type; KeyError if unknown."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """Map a Triton data type number to a numpy type, or None (e.g. BF16, INVALID)."""
    if isinstance(data_type, (int, np.integer)) and not isinstance(data_type, bool):
        return _TRITON_TO_NUMPY.get(int(data_type))
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Map a numpy dtype/type to a Triton data type number, or None if it has none."""
    if data_type is None:
        return None
    if isinstance(data_type, np.dtype):
        return _NUMPY_TO_TRITON.get(data_type.type)
    try:
        found = _NUMPY_TO_TRITON.get(data_type)
        if found is not None:
            return found
        return _NUMPY_TO_TRITON.get(np.dtype(data_type).type)
    except (TypeError, ValueError):
        return None


def _element_bytes(obj: Any) -> bytes:
    """Return the raw bytes of one BYTES-tensor element."""
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    return str(obj).encode("utf-8")


def _serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefix (4-byte little-endian) every element in C order; always bytes."""
    pack = _UINT32.pack
    parts: list[bytes] = []
    append = parts.append
    for obj in array.ravel(order="C").tolist():
        data = _element_bytes(obj)
        append(pack(len(data)))
        append(data)
    return b"".join(parts)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple | None:
    """Serialize an object/bytes/str array to Triton's length-prefixed wire form.

    Like Triton: returns ``bytes``; ``()`` for an empty array; None for numeric arrays.
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OSU":
        return None
    return _serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """Parse length-prefixed elements into a 1-D object array of ``bytes``."""
    if isinstance(encoded_tensor, bytes):
        view = encoded_tensor
    else:
        view = bytes(memoryview(encoded_tensor).cast("B"))
    total = len(view)
    unpack = _UINT32.unpack_from
    items: list[bytes] = []
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise _ArgValueError(
                f"truncated BYTES tensor: length prefix at offset {offset} runs past the end"
            )
        (length,) = unpack(view, offset)
        offset += 4
        end = offset + length
        if end > total:
            raise _ArgValueError(
                f"truncated BYTES tensor: element of {length} bytes at offset {offset} "
                f"runs past the end ({total} bytes)"
            )
        items.append(view[offset:end])
        offset = end
    return np.fromiter(items, dtype=np.object_, count=len(items))


# --------------------------------------------------------------------------------------
# Tensor
# --------------------------------------------------------------------------------------


class _CapsuleHolder:
    """Gives a bare DLPack capsule the ``__dlpack__`` protocol numpy expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; numpy checks the capsule's own device anyway


class Tensor:
    """A named tensor backed by a C-contiguous numpy array (always in CPU memory)."""

    def __init__(self, name: str, data: Any) -> None:
        # exact-type tests first (cheaper than isinstance on this per-output path), the general ones after
        if type(name) is not str and not isinstance(name, str):
            raise _ArgTypeError(f"Tensor name must be a str, got {type(name).__name__}")
        if not name:
            raise _ArgValueError("Tensor name cannot be an empty string.")
        if type(data) is not np.ndarray and not isinstance(data, np.ndarray):
            if isinstance(data, np.generic) or hasattr(data, "__array__") or hasattr(
                data, "__array_interface__"
            ):
                data = np.asarray(data)
            else:
                raise _ArgTypeError(
                    f"data for tensor '{name}' must be a numpy array, "
                    f"got {type(data).__name__}"
                )
        dtype = data.dtype
        triton_dtype = _NUMPY_TO_TRITON.get(dtype.type)
        if triton_dtype is None:
            raise _ArgTypeError(
                f"tensor '{name}' has numpy dtype {dtype}, which Triton does not support"
            )
        if not data.flags.c_contiguous:
            data = data.copy(order="C")
        if not dtype.isnative:
            data = data.astype(dtype.newbyteorder("="))
        self._name = name
        self._array = data
        self._triton_dtype = triton_dtype

    @classmethod
    def _trusted(cls, name: str, data: np.ndarray, triton_dtype: int) -> Tensor:
        """Server-side constructor for request inputs that were already validated (hot path)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = data
        tensor._triton_dtype = triton_dtype
        return tensor

    def name(self) -> str:
        """Return the tensor name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """Return the underlying numpy array (no copy)."""
        return self._array

    def shape(self) -> list[int]:
        """Return the shape as a list of ints."""
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """Return the Triton data type number (``TYPE_STRING``=13 for bytes/str)."""
        return self._triton_dtype

    def is_cpu(self) -> bool:
        """Return True: tensors always live in CPU memory here."""
        return True

    def _exportable(self) -> np.ndarray:
        """Return the array in a form DLPack can export (read-only arrays are copied)."""
        array = self._array
        if array.dtype.kind in "OSU":
            raise TritonModelException(
                f"tensor '{self._name}' holds BYTES data, which DLPack cannot represent"
            )
        if not array.flags.writeable:
            array = array.copy()
            self._array = array
        return array

    def to_dlpack(self) -> Any:
        """Return a DLPack capsule sharing the tensor's memory."""
        try:
            return self._exportable().__dlpack__()
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TritonModelException(f"cannot export tensor '{self._name}': {exc}") from exc

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """DLPack protocol: export the array (arguments are passed to numpy)."""
        return self._exportable().__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack protocol: (device type, device id); always CPU."""
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """Create a tensor from a DLPack capsule or an object with ``__dlpack__``."""
        source = dlpack_tensor
        if not hasattr(source, "__dlpack__"):
            if type(source).__name__ != "PyCapsule":
                raise _ArgTypeError(
                    "from_dlpack expects a DLPack capsule or an object with __dlpack__, "
                    f"got {type(source).__name__}"
                )
            source = _CapsuleHolder(source)
        try:
            array = np.from_dlpack(source)
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            raise TritonModelException(
                f"cannot import tensor '{name}' from DLPack (only CPU tensors of numpy-"
                f"representable dtypes are supported): {exc}"
            ) from exc
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, dtype={self._array.dtype}, shape={self.shape()})"


# --------------------------------------------------------------------------------------
# Requests and responses
# --------------------------------------------------------------------------------------


def _check_parameters(parameters: Any, allow_float: bool) -> None:
    """Validate parameters: None, a JSON string, or a dict of str -> bool/int/str.

    Requests also accept floats: Triton hands DOUBLE request parameters to models.
    """
    if parameters is None or isinstance(parameters, str):
        return
    if not isinstance(parameters, Mapping):
        raise _ArgTypeError(
            f"parameters must be a dict or a JSON string, got {type(parameters).__name__}"
        )
    allowed = (bool, int, str, float) if allow_float else (bool, int, str)
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise _ArgTypeError(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, allowed):
            raise _ArgTypeError(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value)}"
            )


class PreferredMemory:
    """Where BLS outputs should be placed (``TRITONSERVER_MEMORY_*`` and a device id)."""

    def __init__(self, memory_type: int, device_id: int = 0) -> None:
        if memory_type not in (
            TRITONSERVER_MEMORY_CPU,
            TRITONSERVER_MEMORY_CPU_PINNED,
            TRITONSERVER_MEMORY_GPU,
        ):
            raise _ArgValueError(f"unknown preferred memory type {memory_type!r}")
        self.memory_type = int(memory_type)
        self.device_id = int(device_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PreferredMemory):
            return NotImplemented
        return (self.memory_type, self.device_id) == (other.memory_type, other.device_id)

    def __hash__(self) -> int:
        return hash((self.memory_type, self.device_id))

    def __repr__(self) -> str:
        return f"PreferredMemory({self.memory_type}, device_id={self.device_id})"


class InferenceTrace:
    """Placeholder trace handle; tracing contexts are not propagated here."""

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """Return the trace context (always None: no tracing)."""
        return None


_NO_TRACE = InferenceTrace()


class InferenceRequest:
    """A request given to ``execute`` or built by a model for BLS.

    The server builds requests with this constructor too and then sets
    ``_response_sender`` and ``_cancelled``; construction does no copying or JSON work.
    """

    # Defaults of what a request rarely changes: instances store only what differs, which keeps the
    # per-request construction short (the server builds one per request, see ``_from_server``).
    _preferred_memory: PreferredMemory | None = None
    _trace: InferenceTrace | None = None
    _parameters_json: str | None = None
    _input_map: dict[str, Tensor] | None = None
    _input_map_len = 0
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    _response_sender: Any = None
    _sender_factory: Callable[[InferenceRequest], Any] | None = None
    _cancelled: Any = False

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        if parameters is not None:
            _check_parameters(parameters, allow_float=True)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = inputs if isinstance(inputs, list) else list(inputs or ())
        self._requested_output_names = (
            requested_output_names
            if isinstance(requested_output_names, list)
            else list(requested_output_names or ())
        )
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        if preferred_memory is not None:
            self._preferred_memory = preferred_memory
        if trace is not None:
            self._trace = trace
        self._parameters = parameters

    @classmethod
    def _from_server(
        cls,
        request_id: str,
        correlation_id: int | str,
        inputs: dict[str, Tensor],
        requested_output_names: list[str],
        model_name: str,
        model_version: int,
        flags: int,
        timeout: int,
        parameters: dict[str, Any],
        sender_factory: Callable[[InferenceRequest], Any] | None = None,
    ) -> InferenceRequest:
        """The server's constructor for a request given to ``execute`` (hot path): ``inputs`` maps
        unique names to tensors and becomes the lookup index as it is; parameters are checked only
        when there are some, as the constructor would."""
        if parameters:
            _check_parameters(parameters, allow_float=True)
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs = list(inputs.values()) if inputs else []
        request._input_map = inputs_map = {t._name: t for t in inputs}
        request._input_map_len = len(inputs_map)
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        if sender_factory is not None:
            request._sender_factory = sender_factory
        return request

    def inputs(self) -> list[Tensor]:
        """Return the input tensors."""
        return self._inputs

    def _get_input(self, name: str) -> Tensor | None:
        """Find an input by name through a lazily built (first-wins) index."""
        inputs = self._inputs
        index = self._input_map
        if index is None or self._input_map_len != len(inputs):
            index = {t._name: t for t in reversed(inputs)}
            self._input_map = index
            self._input_map_len = len(inputs)
        return index.get(name)

    def request_id(self) -> str:
        """Return the request id ("" if none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """Return the correlation (sequence) id; 0 if none."""
        return self._correlation_id

    def flags(self) -> int:
        """Return the request flags (``TRITONSERVER_REQUEST_FLAG_*``)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Set the request flags."""
        self._flags = flags

    def timeout(self) -> int:
        """Return the timeout in microseconds (0 = none)."""
        return self._timeout

    def parameters(self) -> str:
        """Return the request parameters as a JSON object string."""
        params = self._parameters
        if params is None:
            return "{}"
        if isinstance(params, str):
            return params
        text = self._parameters_json
        if text is None:
            text = json.dumps(params)
            self._parameters_json = text
        return text

    def _parameters_dict(self) -> dict[str, Any]:
        """Return the parameters as a dict (for the server's BLS path)."""
        params = self._parameters
        if params is None:
            return {}
        if isinstance(params, str):
            return json.loads(params)
        return dict(params)

    def requested_output_names(self) -> list[str]:
        """Return the names of the requested outputs (empty = all)."""
        return self._requested_output_names

    def model_name(self) -> str:
        """Return the target model name (BLS) or the model's own name."""
        return self._model_name

    def model_version(self) -> int:
        """Return the target model version (-1 = latest/unspecified)."""
        return self._model_version

    def preferred_memory(self) -> PreferredMemory | None:
        """Return the preferred output memory, if one was given."""
        return self._preferred_memory

    def trace(self) -> InferenceTrace:
        """Return the trace handle of the request."""
        trace = self._trace
        return _NO_TRACE if trace is None else trace

    def is_cancelled(self) -> bool:
        """Return True once the client has cancelled this request."""
        cancelled = self._cancelled
        return bool(cancelled() if callable(cancelled) else cancelled)

    def get_response_sender(self) -> Any:
        """Return the response sender attached by the server."""
        sender = self._response_sender
        if sender is None:
            # a non-decoupled model may answer through a sender too (one response, final flag) and
            # return None from execute; the server gives the factory, the sender is built on demand
            factory = self._sender_factory
            if factory is None:
                raise TritonModelException("this request has no response sender")
            sender = self._response_sender = factory(self)
        return sender

    def set_release_flags(self, flags: int) -> None:
        """Set how the request is released (``TRITONSERVER_REQUEST_RELEASE_*``)."""
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and return the response(s)."""
        executor = _bls_executor
        if executor is None:
            raise TritonModelException("BLS is not supported by this server yet")
        return executor(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """Like ``exec`` but returns an awaitable; call from a running event loop."""
        async_executor = _bls_async_executor
        if async_executor is not None:
            return async_executor(self, decoupled)
        executor = _bls_executor
        if executor is None:
            raise TritonModelException("BLS is not supported by this server yet")
        # No executor threads: under gevent's patching they would be greenlets that the asyncio loop
        # starves. Run the (blocking) BLS call now and hand back a completed future.
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(executor(self, decoupled))
        except Exception as e:  # noqa: BLE001 - delivered through the future
            future.set_exception(e)
        return future

    def __repr__(self) -> str:
        names = [t.name() for t in self._inputs]
        return (
            f"InferenceRequest(request_id={self._request_id!r}, "
            f"model_name={self._model_name!r}, inputs={names})"
        )


class InferenceResponseSender:
    """What ``request.get_response_sender()`` returns for a decoupled model: sends any number of
    responses for one request, the last one (or a response-less call) with
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. The server gives it ``deliver(response, final)`` and
    ``cancelled()``; ``send`` may be called from ``execute`` or from a thread the model started."""

    def __init__(self, deliver: Callable[[Any, bool], None], cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException(f"Invalid response flags: {flags}")
        if response is None:
            if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "Inference Response object must be provided when the response flags is set to zero."
                )
        elif not isinstance(response, InferenceResponse):
            raise _ArgTypeError(f"send() expects an InferenceResponse, got {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if final:
            self._closed = True
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return bool(self._cancelled())


class InferenceResponse:
    """A response: output tensors and/or an error, plus optional parameters."""

    _parameters_json: str | None = None  # class default: set on first parameters() with a dict

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        elif type(output_tensors) is not list and not isinstance(output_tensors, list):
            if isinstance(output_tensors, (str, bytes, Tensor)) or not isinstance(
                output_tensors, Iterable
            ):
                raise _ArgTypeError(
                    "output_tensors must be a list of Tensor, got "
                    f"{type(output_tensors).__name__}"
                )
            output_tensors = list(output_tensors)
        for tensor in output_tensors:
            if type(tensor) is not Tensor and not isinstance(tensor, Tensor):
                raise _ArgTypeError(
                    f"output_tensors must contain Tensor objects, found {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise _ArgTypeError(
                f"error must be a TritonError or None, got {type(error).__name__}"
            )
        if parameters is not None:
            _check_parameters(parameters, allow_float=False)
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        """Return the output tensors."""
        return self._output_tensors

    def has_error(self) -> bool:
        """Return True if the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """Return the error, or None."""
        return self._error

    def parameters(self) -> str:
        """Return the response parameters as a JSON object string."""
        params = self._parameters
        if params is None:
            return "{}"
        if isinstance(params, str):
            return params
        text = self._parameters_json
        if text is None:
            text = json.dumps(params)
            self._parameters_json = text
        return text

    def __repr__(self) -> str:
        names = [t.name() for t in self._output_tensors]
        return f"InferenceResponse(outputs={names}, error={self._error!r})"


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    """Return the request's input tensor called ``name``, or None."""
    if type(inference_request) is InferenceRequest:  # the usual case: its index, while still current
        index = inference_request._input_map
        if index is not None and inference_request._input_map_len == len(inference_request._inputs):
            return index.get(name)
        return inference_request._get_input(name)
    finder = getattr(inference_request, "_get_input", None)
    if finder is not None:
        return finder(name)
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    """Return the response's output tensor called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# --------------------------------------------------------------------------------------
# Model configuration helpers
# --------------------------------------------------------------------------------------


def _config_dict(model_config: Any) -> Mapping[str, Any]:
    """Accept a config dict or a ``ModelConfig``."""
    if isinstance(model_config, ModelConfig):
        return model_config.as_dict()
    return model_config


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict | None:
    """Return the ``input`` entry called ``name`` of a config dict, or None."""
    for entry in _config_dict(model_config).get("input") or ():
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict | None:
    """Return the ``output`` entry called ``name`` of a config dict, or None."""
    for entry in _config_dict(model_config).get("output") or ():
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Return True if the config sets ``model_transaction_policy.decoupled``."""
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """Auto-complete helper wrapping a model config dict (as parsed from Triton's JSON)."""

    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        if isinstance(model_config, (str, bytes, bytearray)):
            model_config = json.loads(model_config)
        if not isinstance(model_config, dict):
            raise _ArgTypeError(
                f"ModelConfig expects a JSON string or a dict, got {type(model_config).__name__}"
            )
        self._model_config = model_config

    def as_dict(self) -> dict[str, Any]:
        """Return the wrapped config dict (not a copy)."""
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; ValueError if the config already has a larger value."""
        current = self._model_config.get("max_batch_size", 0) or 0
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Enable dynamic batching; ValueError if another scheduler is configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to "
                    "set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name()
        if not isinstance(tensor, Mapping):
            raise TypeError(
                f"{kind} in auto-complete-config function for model '{model}' must be a "
                f"dict, got {type(tensor).__name__}"
            )
        label = tensor.get("name", "")
        for key in tensor:
            if key not in allowed:
                quoted = [f"'{k}'" for k in allowed]
                names = ", ".join(quoted[:-1]) + " and " + quoted[-1]
                raise ValueError(
                    f"{kind} '{label}' in auto-complete-config function for model "
                    f"'{model}' contains property other than {names}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{label}' in auto-complete-config function for model "
                    f"'{model}' is missing '{key}' property."
                )
        entries = self._model_config.setdefault(kind, [])
        for current in entries:
            if current.get("name") != label:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type not in ("TYPE_INVALID", "", None) and (
                current_type != tensor["data_type"]
            ):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{current_type} for {kind} '{label}', model provides "
                    f"{tensor['data_type']}"
                )
            current_dims = current.get("dims")
            if current_dims and list(current_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{label}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current_dims)}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{model}', tensor '{label}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entries.append(tensor)

    def add_input(self, input: dict[str, Any]) -> None:
        """Add (or merge into) a config input: keys name, data_type, dims[, optional]."""
        self._add_tensor("input", input, self._INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add (or merge into) a config output: keys name, data_type, dims."""
        self._add_tensor("output", output, self._OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``); no changing a set value."""
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{model}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{model}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted


# --------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------

_LOGGER = logging.getLogger("triton_actor.model")


class LogLevel(IntEnum):
    """Triton's ``Logger.LogLevel`` values."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_STD_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Model logging through the stdlib logger ``triton_actor.model`` (VERBOSE = DEBUG)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at a ``Logger`` level."""
        std_level = _STD_LEVELS.get(level)
        if std_level is None:
            raise _ArgValueError(f"unknown log level {level!r}")
        _LOGGER.log(std_level, "%s", message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _LOGGER.log(logging.INFO, "%s", message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _LOGGER.log(logging.WARNING, "%s", message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _LOGGER.log(logging.ERROR, "%s", message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at VERBOSE (stdlib DEBUG)."""
        _LOGGER.log(logging.DEBUG, "%s", message, stacklevel=2)


# --------------------------------------------------------------------------------------
# Custom metrics
# --------------------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KIND_NAMES = {0: "counter", 1: "gauge", 2: "histogram"}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _ArgTypeError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


class Metric:
    """One labelled series of a ``MetricFamily`` (created with ``family.Metric(...)``).

    Exporter view: ``_family``, ``_labels`` (dict), ``_value`` (counter/gauge) and, for
    histograms, ``_buckets`` (upper bounds), ``_bucket_counts`` (per bucket, not
    cumulative; the last entry is +Inf), ``_sum`` and ``_count``.
    """

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._family = family
        self._labels = labels
        self._value = 0.0
        self._buckets = buckets
        self._bucket_counts = [0] * (len(buckets) + 1) if buckets is not None else None
        self._sum = 0.0
        self._count = 0

    def _kind(self) -> int:
        return self._family._kind

    def increment(self, value: float) -> None:
        """Add ``value`` (counters: must be >= 0; not for histograms)."""
        amount = _number(value, "increment value")
        kind = self._kind()
        if kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment() is not supported for histogram metrics")
        if kind == MetricFamily.COUNTER and amount < 0:
            raise _ArgValueError("a counter can only be incremented by a non-negative value")
        self._value += amount

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        amount = _number(value, "set value")
        if self._kind() != MetricFamily.GAUGE:
            raise TritonModelException(
                f"set() is not supported for {_KIND_NAMES[self._kind()]} metrics"
            )
        self._value = amount

    def observe(self, value: float) -> None:
        """Record one observation in a histogram."""
        amount = _number(value, "observed value")
        if self._kind() != MetricFamily.HISTOGRAM:
            raise TritonModelException(
                f"observe() is not supported for {_KIND_NAMES[self._kind()]} metrics"
            )
        assert self._buckets is not None and self._bucket_counts is not None
        self._bucket_counts[bisect.bisect_left(self._buckets, amount)] += 1
        self._sum += amount
        self._count += 1

    def value(self) -> float:
        """Return the current value of a counter or gauge."""
        if self._kind() == MetricFamily.HISTOGRAM:
            raise TritonModelException("value() is not supported for histogram metrics")
        return self._value

    def __repr__(self) -> str:
        return f"Metric({self._family._name!r}, labels={self._labels})"


class MetricKind(enum.IntEnum):
    """Metric kinds; also reachable as ``MetricFamily.COUNTER`` (current) and ``pb_utils.COUNTER`` (old examples)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM


class MetricFamily:
    """A named custom metric family of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise _ArgTypeError("MetricFamily name and description must be str")
        if not _METRIC_NAME.match(name):
            raise _ArgValueError(f"invalid metric family name '{name}'")
        if isinstance(kind, bool) or kind not in _KIND_NAMES:
            raise _ArgValueError(f"unknown metric kind {kind!r}")
        self._name = name
        self._description = description
        self._kind = int(kind)
        self._metrics: dict[tuple[tuple[str, str], ...], Metric] = {}
        for family in _metric_families:
            if family._name != name:
                continue
            if family._kind != self._kind or family._description != description:
                raise TritonModelException(
                    f"metric family '{name}' already exists with a different "
                    "description or kind"
                )
            self._metrics = family._metrics  # same family: share its series
            return
        _metric_families.append(self)

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """Return the series for ``labels`` (histograms need ascending ``buckets``)."""
        labels = dict(labels) if labels else {}
        for key, val in labels.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise _ArgTypeError("metric labels must map str to str")
            if not _LABEL_NAME.match(key):
                raise _ArgValueError(f"invalid metric label name '{key}'")
        bounds: list[float] | None = None
        if self._kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise _ArgValueError("a histogram metric needs buckets")
            bounds = [_number(b, "bucket boundary") for b in buckets]
            if any(b >= c for b, c in itertools.pairwise(bounds)):
                raise _ArgValueError("histogram buckets must be strictly increasing")
        elif buckets is not None:
            raise _ArgValueError(
                f"buckets are only valid for histogram metrics, not {_KIND_NAMES[self._kind]}"
            )
        key = tuple(sorted(labels.items()))
        existing = self._metrics.get(key)
        if existing is not None:
            if existing._buckets != bounds:
                raise TritonModelException(
                    f"metric {labels} of family '{self._name}' already exists with "
                    "different buckets"
                )
            return existing
        metric = Metric(self, labels, bounds)
        self._metrics[key] = metric
        return metric

    def __repr__(self) -> str:
        return f"MetricFamily({self._name!r}, kind={_KIND_NAMES[self._kind]})"


_metric_families: list[MetricFamily] = []


# --------------------------------------------------------------------------------------
# Model control from python models
# --------------------------------------------------------------------------------------


def _model_controller() -> Any:
    control = _model_control
    if control is None:
        raise TritonModelException(
            "model control from python models is not supported by this server yet"
        )
    return control


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``; EXPLICIT model-control mode only."""
    _model_controller().load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name``; EXPLICIT model-control mode only."""
    _model_controller().unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Return True if ``model_name`` (optionally a version) is ready."""
    return bool(_model_controller().is_model_ready(model_name, model_version))

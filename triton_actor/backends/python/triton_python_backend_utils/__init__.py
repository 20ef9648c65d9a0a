"""In-process stand-in for Triton's ``triton_python_backend_utils`` module: its public face.

Python-backend ``model.py`` files do ``import triton_python_backend_utils as pb_utils``; the python
backend (``backend.py``) puts this package in ``sys.modules`` under that top-level name, so the files
run unchanged. This module only re-exports; each name lives in the submodule that owns it:

* ``constants`` -- request/response flags, memory types, ``TYPE_*`` numbers
* ``dtypes`` -- type mappings and the BYTES wire form
* ``errors`` -- ``TritonModelException``, ``TritonError``
* ``tensor`` -- ``Tensor``
* ``dlpack`` -- BF16 through DLPack (numpy has no bfloat16)
* ``requests`` -- ``InferenceRequest`` (+ ``PreferredMemory``, ``InferenceTrace``)
* ``responses`` -- ``InferenceResponse``, ``InferenceResponseSender``
* ``parameters`` -- the parameters check and ``parameters()`` of both
* ``model_config`` -- ``ModelConfig`` and the config lookups
* ``logger`` -- ``Logger``, ``LogLevel``
* ``metrics`` -- ``MetricFamily``, ``Metric`` (kept in memory, in the calling server's registry)
* ``server_calls`` -- BLS and model control, through the calling server's hooks (none: "not
  supported by this server yet")
* ``serving`` -- which server a call belongs to: each server's ``ServerHooks`` (not Triton's API)

Only numpy and the standard library are used.
"""

from __future__ import annotations

from .constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    TYPE_BF16,
    TYPE_BOOL,
    TYPE_FP16,
    TYPE_FP32,
    TYPE_FP64,
    TYPE_INT8,
    TYPE_INT16,
    TYPE_INT32,
    TYPE_INT64,
    TYPE_INVALID,
    TYPE_STRING,
    TYPE_UINT8,
    TYPE_UINT16,
    TYPE_UINT32,
    TYPE_UINT64,
)
from .dtypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from .errors import TritonError, TritonModelException
from .logger import Logger, LogLevel
from .metrics import COUNTER, GAUGE, HISTOGRAM, Metric, MetricFamily, MetricKind
from .model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from .requests import InferenceRequest, InferenceTrace, PreferredMemory, get_input_tensor_by_name
from .responses import InferenceResponse, InferenceResponseSender, get_output_tensor_by_name
from .server_calls import is_model_ready, load_model, unload_model
from .tensor import Tensor

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "TYPE_BF16",
    "TYPE_BOOL",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_INVALID",
    "TYPE_STRING",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

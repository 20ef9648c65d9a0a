"""Triton's numeric constants as ``pb_utils`` exposes them: request/response flags, memory types and
the ``model_config.proto`` data type numbers.

Owner: nobody; immutable values, safe from any thread. Values match Triton's C API and
``model_config.proto`` exactly: model code compares them with numbers it got from Triton.
"""

from __future__ import annotations

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

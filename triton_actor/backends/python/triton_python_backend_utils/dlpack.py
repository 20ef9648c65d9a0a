"""BF16 through DLPack, as Triton's python backend moves it: numpy has no bfloat16, so a BF16 tensor is
held as raw 16-bit patterns and crosses to torch & co. only as a DLPack tensor of type bfloat16.

numpy can neither export nor import a bfloat16 DLPack tensor, so the capsule's data type is rewritten in
place: a uint16 export becomes bfloat16 on the way out, a bfloat16 import is read as uint16. The capsule
layouts are DLPack's public ABI (``dlpack.h``: ``DLManagedTensor`` for a "dltensor" capsule,
``DLManagedTensorVersioned`` for "dltensor_versioned"); ctypes reaches them through the public
``PyCapsule_*`` C API. Only the ``dtype`` field of a capsule nobody has consumed yet is written; its owner
and deleter stay as they are.

Owner: nobody (pure functions; any thread).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

# How a BF16 tensor's elements are held in numpy: 2 opaque bytes each. The server's protocol layer reads
# this dtype as BF16 (``triton_actor.protocol.dtypes``), and no other Triton type maps to a void dtype.
BF16_NUMPY = np.dtype("V2")

_KDL_UINT = 1
_KDL_BFLOAT = 4


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensorHead(ctypes.Structure):
    """The leading fields of ``DLTensor`` up to ``dtype`` (data, device, ndim, dtype)."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", _DataType)]


# DLManagedTensorVersioned: {DLPackVersion version (2 x uint32); void* manager_ctx; deleter; uint64 flags;
# DLTensor dl_tensor}; DLManagedTensor starts with its DLTensor.
_OFFSETS = {b"dltensor": 0, b"dltensor_versioned": 8 + 3 * ctypes.sizeof(ctypes.c_void_p)}

_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _data_type(capsule: Any) -> _DataType | None:
    """The ``dtype`` field of an unconsumed DLPack capsule (writable in place), or None if it is not one."""
    for name, offset in _OFFSETS.items():
        if _is_valid(capsule, name):
            return _DLTensorHead.from_address(_get_pointer(capsule, name) + offset).dtype
    return None


KDL_CPU = 1  # DLDeviceType's kDLCPU: the one device numpy imports from


def device_type(capsule: Any) -> int | None:
    """The ``device_type`` of an unconsumed DLPack capsule (kDLCPU, kDLCUDA = 2, ...), or None if it is not one."""
    for name, offset in _OFFSETS.items():
        if _is_valid(capsule, name):
            return _DLTensorHead.from_address(_get_pointer(capsule, name) + offset).device_type
    return None


def is_bf16(capsule: Any) -> bool:
    dtype = _data_type(capsule)
    return dtype is not None and (dtype.code, dtype.bits, dtype.lanes) == (_KDL_BFLOAT, 16, 1)


def relabel(capsule: Any, to_bf16: bool) -> Any:
    """Rewrite a capsule's type uint16 → bfloat16 (``to_bf16``) or bfloat16 → uint16; return the capsule."""
    dtype = _data_type(capsule)
    source, target = (_KDL_UINT, _KDL_BFLOAT) if to_bf16 else (_KDL_BFLOAT, _KDL_UINT)
    if dtype is not None and (dtype.code, dtype.bits, dtype.lanes) == (source, 16, 1):
        dtype.code = target
    return capsule

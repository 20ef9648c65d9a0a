"""Triton data types: config enum names, protocol strings, numpy dtypes and element sizes (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md#datatypes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    """One Triton data type. ``itemsize`` is 0 for BYTES (variable length)."""

    enum_name: str  # "TYPE_FP32"
    enum_value: int  # 11
    wire: str  # "FP32" (KServe V2 / gRPC datatype string)
    numpy: np.dtype | None  # None for BF16 (no numpy type)
    itemsize: int

    def __hash__(self) -> int:
        # the enum value alone tells the types apart; the generated hash of all five fields ran 22 bytecodes
        # (and numpy's dtype hash) for every memo keyed by input types, once per request and ensemble step
        return self.enum_value


def _t(enum_name: str, value: int, wire: str, np_type: object, size: int) -> DType:
    return DType(enum_name, value, wire, np.dtype(np_type) if np_type is not None else None, size)


ALL: tuple[DType, ...] = (
    _t("TYPE_BOOL", 1, "BOOL", np.bool_, 1),
    _t("TYPE_UINT8", 2, "UINT8", np.uint8, 1),
    _t("TYPE_UINT16", 3, "UINT16", np.uint16, 2),
    _t("TYPE_UINT32", 4, "UINT32", np.uint32, 4),
    _t("TYPE_UINT64", 5, "UINT64", np.uint64, 8),
    _t("TYPE_INT8", 6, "INT8", np.int8, 1),
    _t("TYPE_INT16", 7, "INT16", np.int16, 2),
    _t("TYPE_INT32", 8, "INT32", np.int32, 4),
    _t("TYPE_INT64", 9, "INT64", np.int64, 8),
    _t("TYPE_FP16", 10, "FP16", np.float16, 2),
    _t("TYPE_FP32", 11, "FP32", np.float32, 4),
    _t("TYPE_FP64", 12, "FP64", np.float64, 8),
    _t("TYPE_STRING", 13, "BYTES", np.object_, 0),
    _t("TYPE_BF16", 14, "BF16", None, 2),
)

BY_WIRE: dict[str, DType] = {d.wire: d for d in ALL}
BY_ENUM_NAME: dict[str, DType] = {d.enum_name: d for d in ALL}
BY_ENUM_VALUE: dict[int, DType] = {d.enum_value: d for d in ALL}
BYTES = BY_WIRE["BYTES"]
BF16 = BY_WIRE["BF16"]


# BF16 has no numpy type: its 16-bit patterns travel in arrays of 2-byte void elements, the dtype
# pb_utils holds BF16 tensors in (``triton_python_backend_utils.dlpack.BF16_NUMPY``); no other Triton
# type is a void dtype, so an output array of it is BF16 on the wire.
BF16_NUMPY = np.dtype("V2")

# the types of numpy dtypes in native byte order, but object arrays (``from_numpy`` knows the rest)
BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in ALL if d.numpy is not None and d.numpy.kind != "O"}
BY_NUMPY[BF16_NUMPY] = BF16


def from_numpy(dtype: np.dtype) -> DType | None:
    """The Triton type of a numpy dtype; object, bytes and str arrays are BYTES."""
    found = BY_NUMPY.get(dtype)
    if found is not None:
        return found
    return BYTES if dtype.kind in ("O", "S", "U") else BY_NUMPY.get(dtype.newbyteorder("="))

"""``pb_utils.Tensor``: a named numpy array, with DLPack import and export.

Owner: the request or response that holds it; a tensor is built and read on the instance's native
thread (or a thread the model started) and is not shared. Failure: arguments Triton's pybind11 would
not convert (a name that is no str, data that is no array) raise its plain ``TypeError``; an empty
name (Triton's stub check) and DLPack problems ``TritonModelException``; a dtype Triton has no type for
raises at construction.
``Tensor._trusted`` is the server's constructor for request inputs it has already validated (hot path).

BF16 (as in Triton's python backend, ``pb_tensor.cc``): numpy has no bfloat16, so ``as_numpy()`` raises
and the tensor moves only through DLPack (``to_dlpack``/``from_dlpack``, e.g. with ``torch.bfloat16``);
its 16-bit patterns are held in an array of dtype ``dlpack.BF16_NUMPY``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from . import dlpack, dtypes
from .constants import TYPE_BF16
from .errors import TritonModelException, _ArgTypeError
from .pybind_args import as_str, incompatible, is_str

# Bound by assignment, not by ``from .dtypes import``: CPython 3.11 compiles ``name.get(...)`` on a name an
# import statement bound as an attribute load (it assumes a module), which builds a bound method on every
# call; measured +60 ns per ``Tensor(...)``, the per-output path.
_NUMPY_TO_TRITON = dtypes._NUMPY_TO_TRITON
# The same map keyed by the native-order dtype of each fixed-size type: one lookup answers both "which Triton
# type" and "already native byte order" for the usual array, where ``dtype.type`` and ``dtype.isnative`` were two
# attribute reads and a branch more (add_sub's two outputs: 98 to 78 bytecodes). Other dtypes (byte-swapped,
# sized BYTES) take the general lookup (``_any_dtype``).
_NATIVE_TO_TRITON = {np.dtype(t): v for t, v in _NUMPY_TO_TRITON.items() if np.dtype(t).itemsize or t is np.object_}
_SIGNATURE = "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
# pb_tensor.cc's text, its line continuation's spaces included
_NOT_DLPACK = ("Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and "
               "`__dlpack_device__` attributes")


class _CapsuleHolder:
    """Gives a bare DLPack capsule the ``__dlpack__`` protocol numpy expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; numpy checks the capsule's own device anyway


_ndarray = np.ndarray


def _general_args(name: Any, data: Any) -> tuple[str, np.ndarray]:
    """``Tensor(name, data)``'s arguments other than a str and an exact ndarray: converted as pybind11
    would (bytes to str, an array-like to an array: Triton's takes only ndarrays), else its TypeError."""
    given = name
    if type(name) is not str and not isinstance(name, str):
        if not isinstance(name, bytes):
            raise incompatible("__init__", _SIGNATURE, (given, data), constructor=True)
        name = as_str(name)
    if type(data) is not np.ndarray and not isinstance(data, np.ndarray):
        if isinstance(data, np.generic) or hasattr(data, "__array__") or hasattr(data, "__array_interface__"):
            data = np.asarray(data)
        else:
            raise incompatible("__init__", _SIGNATURE, (given, data), constructor=True)
    return name, data


def _any_dtype(name: str, data: np.ndarray) -> tuple[np.ndarray, int]:
    """``Tensor(name, data)`` for a dtype not in ``_NATIVE_TO_TRITON``: its Triton type (or the refusal),
    the array made C-contiguous and native byte order."""
    dtype = data.dtype
    triton_dtype = _NUMPY_TO_TRITON.get(dtype.type)
    if triton_dtype is None:
        raise _ArgTypeError(f"tensor '{name}' has numpy dtype {dtype}, which Triton does not support")
    if not data.flags.c_contiguous:
        data = data.copy(order="C")
    if not dtype.isnative:
        data = data.astype(dtype.newbyteorder("="))
    return data, triton_dtype


def _export(source: Any) -> Any:
    """``source.__dlpack__()`` as a consumer asks it (Triton passes ``stream=None``): a versioned capsule where
    the producer supports DLPack 1.0 (it can say read-only), else the legacy one."""
    try:
        return source.__dlpack__(stream=None, max_version=(1, 0))
    except TypeError:
        return source.__dlpack__(stream=None)


def _to_host(name: str, capsule: Any) -> Any:
    """A device tensor's capsule (a KIND_GPU model's CUDA output, as Triton's GPU models give them) as a CPU
    tensor of its framework: tensors live in CPU memory here, so it is copied to the host once, where Triton
    would copy it for the response anyway (or hand it to the next step on the device). Through torch (the
    framework such models use), else CuPy; neither: the error says so."""
    try:
        import torch
    except ImportError:
        torch = None
    try:
        if torch is not None:
            return torch.utils.dlpack.from_dlpack(capsule).cpu()
        import cupy  # type: ignore[import-not-found]

        return cupy.asnumpy(cupy.from_dlpack(capsule))
    except ImportError:
        raise TritonModelException(f"tensor '{name}' is in device memory and neither torch nor cupy is here "
                                   "to copy it to the host") from None
    except Exception as e:  # the framework's refusal (torch without CUDA asserts): the model's error
        raise TritonModelException(f"tensor '{name}' is in device memory and could not be copied to the host: "
                                   f"{e!r}") from e


class Tensor:
    """A named tensor backed by a C-contiguous numpy array (always in CPU memory: a device tensor given to
    :meth:`from_dlpack` is copied to the host)."""

    def __init__(self, name: str, data: Any) -> None:
        # exact-type tests first (cheaper than isinstance on this per-output path), the general ones after;
        # arguments pybind11 would not convert are its TypeError, before the stub's empty-name check
        if type(name) is not str or type(data) is not _ndarray:
            name, data = _general_args(name, data)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        triton_dtype = _NATIVE_TO_TRITON.get(data.dtype)
        if triton_dtype is None:
            data, triton_dtype = _any_dtype(name, data)
        elif not data.flags.c_contiguous:
            data = data.copy(order="C")
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
        """Return the underlying numpy array (no copy); a BF16 tensor has none (Triton's error text)."""
        if self._triton_dtype == TYPE_BF16:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def shape(self) -> list[int]:
        """Return the shape as a list of ints."""
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """Return the Triton data type number (``TYPE_STRING``=13 for bytes/str)."""
        return self._triton_dtype

    def is_cpu(self) -> bool:
        """Return True: tensors always live in CPU memory here (from_dlpack copies a device tensor)."""
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
        # BF16: exported as uint16, whose capsule is then relabelled bfloat16
        return array.view(np.uint16) if self._triton_dtype == TYPE_BF16 else array

    def to_dlpack(self) -> Any:
        """Return a DLPack capsule sharing the tensor's memory."""
        try:
            capsule = self._exportable().__dlpack__()
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TritonModelException(f"cannot export tensor '{self._name}': {exc}") from exc
        return dlpack.relabel(capsule, to_bf16=True) if self._triton_dtype == TYPE_BF16 else capsule

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """DLPack protocol: export the array (arguments are passed to numpy)."""
        capsule = self._exportable().__dlpack__(stream=stream, **kwargs)
        return dlpack.relabel(capsule, to_bf16=True) if self._triton_dtype == TYPE_BF16 else capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack protocol: (device type, device id); always CPU."""
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """Create a tensor from a DLPack capsule or an object with ``__dlpack__`` (BF16 included)."""
        if not is_str(name):
            raise incompatible("from_dlpack", "(self: str, arg0: object) -> c_python_backend_utils.Tensor",
                               (name, dlpack_tensor))
        name = as_str(name)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        source = dlpack_tensor
        exporter = hasattr(source, "__dlpack__") and hasattr(source, "__dlpack_device__")
        if not exporter and type(source).__name__ != "PyCapsule":
            raise TritonModelException(_NOT_DLPACK)
        try:
            capsule = _export(source) if exporter else source
            if dlpack.device_type(capsule) not in (None, dlpack.KDL_CPU):
                capsule = _export(_to_host(name, capsule))
            bf16 = dlpack.is_bf16(capsule)
            array = np.from_dlpack(_CapsuleHolder(dlpack.relabel(capsule, to_bf16=False) if bf16 else capsule))
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            raise TritonModelException(
                f"cannot import tensor '{name}' from DLPack (tensors of numpy-representable dtypes or "
                f"bfloat16 are supported; one in device memory is copied to the host): {exc}"
            ) from exc
        if bf16:
            contiguous = array if array.flags.c_contiguous else array.copy(order="C")
            return Tensor._trusted(name, contiguous.view(dlpack.BF16_NUMPY), TYPE_BF16)
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, dtype={self._array.dtype}, shape={self.shape()})"


class _InputTensor(Tensor):
    """An input of a request the server hands ``execute`` while fast paths are on: it holds the server's
    ``InferInput`` (an immutable NamedTuple) and reads its name, array and type from it when asked, by
    getters in C (two stores per input instead of four, and no attribute chain read for an input the model
    never looks at). Shown as a ``Tensor`` (pybind11's texts print the class name)."""

    _name = property(attrgetter("_given.name"))  # type: ignore[assignment]
    _array = property(attrgetter("_given.data"))  # type: ignore[assignment]
    _triton_dtype = property(attrgetter("_given.dtype.enum_value"))  # type: ignore[assignment]

    # the model's reads, in Python: a getter property's call and attrgetter chain cost more than these
    # (two inputs' get_input_tensor_by_name and as_numpy: 0.35 us plain, 0.62 through the properties)
    def name(self) -> str:
        return self._given.name

    def as_numpy(self) -> np.ndarray:
        given = self._given
        if given.dtype.enum_value == TYPE_BF16:
            return Tensor.as_numpy(self)  # its error
        return given.data

    def _exportable(self) -> np.ndarray:
        """Become a plain ``Tensor`` first: an export may replace the array by a writable copy."""
        given = self._given
        self.__class__ = Tensor
        self._name, self._array, self._triton_dtype = given.name, given.data, given.dtype.enum_value
        return self._exportable()


_InputTensor.__name__ = "Tensor"  # not its __qualname__: pickle finds the class by that

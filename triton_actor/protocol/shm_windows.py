"""Shared-memory windows in a request (sans-I/O): a tensor's ``shared_memory_*`` parameters read and
written through a :class:`SharedMemoryAccess` the data plane passes in (its registry,
``host/shared_memory.py``), so the codecs import neither the registry nor the thread bridge."""

from __future__ import annotations

import base64
from typing import Any, Protocol

from ..errors import TritonError


class SharedMemoryAccess(Protocol):
    """What a codec needs of the shared-memory regions clients registered (any thread)."""

    def read(self, name: str, offset: Any, byte_size: Any, what: str) -> memoryview: ...

    def write(self, name: str, offset: Any, byte_size: Any, data: bytes | memoryview, what: str) -> None: ...


def write_output(shm: SharedMemoryAccess | None, window: tuple[str, int, int], data: bytes,
                 what: str) -> dict[str, Any]:
    """Write an output's bytes to its window; returns the parameters its response entry carries."""
    if shm is None:
        raise TritonError.unsupported(f"{what}: shared memory is not available on this endpoint")
    region, offset, size = window
    shm.write(region, offset, size, data, what)
    params: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": len(data)}
    if offset:
        params["shared_memory_offset"] = offset
    return params


def parse_window(region: Any, offset: Any, byte_size: Any, what: str) -> tuple[str, int, int]:
    """(region, offset, byte size) from a tensor's ``shared_memory_*`` parameters (HTTP or gRPC values)."""
    offset = 0 if offset is None else offset
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, byte_size))
    if not isinstance(region, str) or not ints:
        raise TritonError.invalid_arg(f"{what}: 'shared_memory_region' (string) and 'shared_memory_byte_size' "
                                      "(integer) must be given together, with an optional 'shared_memory_offset'")
    return region, offset, byte_size


def http_raw_handle(value: Any) -> bytes | None:
    """A CUDA region's ``raw_handle`` as the HTTP register request carries it (``{"b64": "<base64>"}``, as
    tritonclient sends it), decoded; None when it is not that shape or not base64 (the registry refuses
    it as Triton refuses a handle it cannot open)."""
    if not isinstance(value, dict) or not isinstance(value.get("b64"), str):
        return None
    try:
        return base64.b64decode(value["b64"], validate=True)
    except ValueError:
        return None

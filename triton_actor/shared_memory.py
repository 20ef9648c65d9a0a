"""System shared memory regions registered by clients (spec §1.11): the one registry for HTTP and gRPC.

A client creates a POSIX shared-memory object (``shm_open(key)``, i.e. ``/dev/shm/<key>``), registers
``[offset, offset + byte_size)`` of it under a name, and then names the region in inference inputs
(the server reads the tensor there) and requested outputs (the server writes the result there).

Every access is bounds-checked against the registered window: an offset or size from a client can
never read or write outside it, and the window itself must lie inside the object (checked at
registration, so a short file cannot fault the server). Keys are single POSIX shm names, never
paths. Every method runs in a hub greenlet without switching, so the registry needs no lock.
CUDA shared memory is not supported (no GPU support in this server).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

from .errors import Code, TritonError

SHM_DIR = "/dev/shm"


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    buffer: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    """Registered system shared-memory regions by name."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self._regions:
            raise TritonError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        if not name:
            raise TritonError.invalid_arg("shared memory region name must not be empty")
        if offset < 0 or byte_size <= 0:
            raise TritonError.invalid_arg(f"invalid offset {offset} or byte_size {byte_size} for region '{name}'")
        path = _path(key)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            raise TritonError.internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise TritonError.invalid_arg(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} exceeds the size "
                    f"{size} of '{key}'"
                )
            buffer = mmap.mmap(fd, offset + byte_size)
        except OSError as e:
            raise TritonError.internal(f"Unable to map shared memory region '{key}': {e}") from None
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, buffer)

    def unregister(self, name: str = "") -> None:
        """Unregister one region, or all when ``name`` is empty; an unknown name is a no-op (as Triton)."""
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.pop(n, None)
            if region is not None:
                region.buffer.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise TritonError.not_found(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [r.status() for r in self._regions.values()]

    def _window(self, name: str, offset: int, byte_size: int, what: str) -> tuple[Region, int]:
        region = self._regions.get(name)
        if region is None:
            raise TritonError.invalid_arg(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise TritonError.invalid_arg(
                f"{what}: offset {offset} and byte size {byte_size} are outside shared memory region '{name}' "
                f"of {region.byte_size} bytes"
            )
        return region, region.offset + offset

    def read(self, name: str, offset: int, byte_size: int, what: str) -> bytes:
        """A copy of ``byte_size`` bytes at ``offset`` in the region (a copy: the region may go away)."""
        region, start = self._window(name, offset, byte_size, what)
        return region.buffer[start : start + byte_size]

    def write(self, name: str, offset: int, byte_size: int, data: bytes, what: str) -> None:
        """Write ``data`` at ``offset``; it must fit in the ``byte_size`` the client gave for it."""
        if len(data) > byte_size:
            raise TritonError.invalid_arg(
                f"shared memory size specified with the request for {what} ({byte_size} bytes) should be at least "
                f"{len(data)} bytes to hold the results"
            )
        region, start = self._window(name, offset, byte_size, what)
        region.buffer[start : start + len(data)] = data


def write_output(shm: SharedMemoryRegistry | None, window: tuple[str, int, int], data: bytes,
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


def _path(key: str) -> str:
    """``shm_open`` names: one leading slash, then a name with no other slash."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise TritonError.invalid_arg(f"invalid shared memory key '{key}': expected a name like '/my_region'")
    return os.path.join(SHM_DIR, name)

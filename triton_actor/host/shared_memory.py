"""Shared-memory regions clients register so tensors need not travel in the request (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_shared_memory.md).

One :class:`SharedMemoryRegistry` per server, owned by the data plane: regions are registered and
unregistered by the hub thread (front-end greenlets) only, but a big request is decoded on a native thread
(``call_in_thread``), which reads its inputs' regions there. So a region's descriptor is closed only once
no read or write uses it (a count under a native lock, held for a few instructions): closed under a read,
the number could be reused by the next registration and the read would return another client's bytes. System regions are POSIX shared-memory objects
(``shm_open``) mapped whole; every read and write is checked against the region's registered window
(``offset`` .. ``offset + byte_size``), so nothing a client sends reaches outside it. Region names share
one namespace across system and CUDA memory. Regions are read and written with ``pread``/``pwrite`` on
the object's descriptor, never through a mapping: a client that truncates its object after registering it
gets an error, not a server killed by SIGBUS. Each registered system region thus holds one descriptor
in each worker (none leaks into isolated models' processes: ``shm_open`` sets close-on-exec), so their
number is bounded by ``max_regions``, which the server derives from its open-file limit
(``frontends/descriptors.region_total``): a client that registers more is refused as Triton refuses a
region it cannot map, and connections, model loads and isolated models keep their descriptors. CUDA
regions hold nothing: they need a GPU; without one, registering answers UNSUPPORTED. Registering client
shared memory is refused unless the server runs with ``--allow-client-shm=true``, as Triton does since
its server PR #8721 (docs/compatibility.md).
"""

from __future__ import annotations

import _posixshmem
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import TritonError
from ..runtime.threads import native_lock

# sizeof(cudaIpcMemHandle_t): what a client's raw_handle must be (tritonclient.utils.cuda_shared_memory)
CUDA_IPC_HANDLE_BYTES = 64

# A POSIX shared-memory object name: an optional leading "/" and no other "/" (shm_open's rule),
# so a key can only name an object under /dev/shm, never a path.
_KEY = re.compile(r"/?[^/\x00]{1,250}")


@dataclass(slots=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0  # reads and writes using ``fd`` now (under the registry's lock)
    gone: bool = False  # unregistered: ``fd`` is closed by its last user


def _size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TritonError.invalid_arg(f"'{what}' must be a non-negative integer, got {value!r}")
    return value


class SharedMemoryRegistry:
    """Registered regions by name; see the module docstring."""

    def __init__(self, allowed: bool = False, gpu_count: int = 0, max_regions: int | None = None) -> None:
        """``max_regions``: the most system regions held at once (None: no bound; the server passes
        ``frontends.descriptors.region_total()``)."""
        self.allowed = allowed
        self.gpu_count = gpu_count
        self.max_regions = max_regions
        self._system: dict[str, _Region] = {}
        self._keys: set[str] = set()  # the keys of ``_system``: a registration's check does not walk them all
        self._fds = native_lock()  # guards each region's users / gone / closing its fd

    def _check_allowed(self) -> None:
        """Triton's refusal, word for word (its ``kClientShmDisabledErrorStr``, UNSUPPORTED): registering and
        unregistering are refused; the status calls answer (no region is registered)."""
        if not self.allowed:
            raise TritonError.unsupported(
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.")

    # -- system shared memory ---------------------------------------------------------------------------
    def register_system(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self._check_allowed()
        offset, byte_size = _size(offset, "offset"), _size(byte_size, "byte_size")
        if name in self._system:
            raise TritonError.already_exists(f"shared memory region '{name}' already in manager")
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.strip("/") in (".", ".."):
            raise TritonError.invalid_arg(f"Unable to open shared memory region: {key!r} is not a shared memory key")
        if key in self._keys:
            raise TritonError.invalid_arg(
                f'registering an active shared memory key, "{key}", under a different name is not currently supported')
        if self.max_regions is not None and len(self._system) >= self.max_regions:
            # Triton's answer when it cannot map one more region (its mmap fails): INVALID_ARG, same prefix
            raise TritonError.invalid_arg(
                f"failed to register shared memory region '{name}': {len(self._system)} regions are registered, "
                "the most this server's open-file limit allows; unregister one first")
        try:
            fd = _posixshmem.shm_open(key, os.O_RDWR, 0o600)
        except OSError:
            raise TritonError.internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            size = os.fstat(fd).st_size
        except OSError as e:
            os.close(fd)
            raise TritonError.invalid_arg(f"failed to register shared memory region '{name}': {e}") from None
        if size == 0 or offset + byte_size > size:
            os.close(fd)
            raise TritonError.invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        self._system[name] = _Region(name, key, offset, byte_size, fd)
        self._keys.add(key)

    def system_status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            region = self._system.get(name)
            if region is None:
                raise TritonError.not_found(f"Unable to find system shared memory region: '{name}'")
            regions = [region]
        else:
            regions = list(self._system.values())
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]

    def unregister_system(self, name: str = "") -> None:
        """Forget one region (an unknown name is not an error, as in Triton) or, with no name, all."""
        self._check_allowed()
        for region in [self._system.pop(name)] if name in self._system else ([] if name else self._pop_all()):
            self._release(region)

    def _pop_all(self) -> list[_Region]:
        regions = list(self._system.values())
        self._system.clear()
        return regions

    # -- CUDA shared memory ----------------------------------------------------------------------------
    def register_cuda(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        self._check_allowed()
        if name in self._system:
            raise TritonError.already_exists(f"shared memory region '{name}' already in manager")
        if not isinstance(raw_handle, (bytes, bytearray)) or len(raw_handle) != CUDA_IPC_HANDLE_BYTES:
            # what Triton answers for a handle CUDA cannot open (shared_memory_manager.cc OpenCudaIPCRegion)
            raise TritonError.invalid_arg("failed to register shared memory region: invalid args")
        raise TritonError.unsupported(
            f"failed to register CUDA shared memory region '{name}': CUDA shared memory is not supported by this "
            "server" + ("" if self.gpu_count else " (no GPU on this host)"))

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return []
        if name in self._system:
            raise TritonError.not_found(
                f"The region named '{name}' is registered as system shared memory, not CUDA shared memory")
        raise TritonError.not_found(f"Unable to find cuda shared memory region: '{name}'")

    def unregister_cuda(self, name: str = "") -> None:
        self._check_allowed()

    # -- tensors -------------------------------------------------------------------------------------------
    def _window(self, name: str, offset: Any, byte_size: Any, what: str) -> tuple[_Region, int, int]:
        region = self._system.get(name) if isinstance(name, str) else None
        if region is None:
            raise TritonError.not_found(f"Unable to find shared memory region: '{name}'")
        offset, byte_size = _size(offset, "shared_memory_offset"), _size(byte_size, "shared_memory_byte_size")
        if offset > region.byte_size or offset + byte_size > region.byte_size:
            raise TritonError.invalid_arg(
                f"{what}: {byte_size} byte(s) at offset {offset} do not fit shared memory region '{name}' "
                f"({region.byte_size} bytes)")
        start = region.offset + offset
        return region, start, byte_size

    @contextmanager
    def _using(self, region: _Region, name: str) -> Iterator[int]:
        """``region``'s descriptor, kept open until the block ends (see the module docstring)."""
        with self._fds:
            if region.gone:
                raise TritonError.not_found(f"Unable to find shared memory region: '{name}'")
            region.users += 1
        try:
            yield region.fd
        finally:
            with self._fds:
                region.users -= 1
                last = region.gone and not region.users
            if last:
                os.close(region.fd)

    def _release(self, region: _Region) -> None:
        self._keys.discard(region.key)
        with self._fds:
            region.gone = True
            unused = not region.users
        if unused:
            os.close(region.fd)

    def read(self, name: str, offset: Any, byte_size: Any, what: str) -> memoryview:
        """A copy of ``byte_size`` bytes at ``offset`` inside region ``name`` (any thread)."""
        self._check_allowed()
        region, start, size = self._window(name, offset, byte_size, what)
        buf = bytearray(size)
        with self._using(region, name) as fd:
            try:
                got = os.preadv(fd, [buf], start) if size else 0
            except OSError as e:
                raise TritonError.internal(f"{what}: reading shared memory region '{name}' failed: {e}") from None
        if got != size:
            raise TritonError.invalid_arg(
                f"{what}: shared memory region '{name}' is smaller than when it was registered")
        return memoryview(buf)

    def write(self, name: str, offset: Any, byte_size: Any, data: bytes | memoryview, what: str) -> None:
        """Copy ``data`` into region ``name`` at ``offset``; it must fit the ``byte_size`` the client gave."""
        self._check_allowed()
        region, start, size = self._window(name, offset, byte_size, what)
        if len(data) > size:
            raise TritonError.invalid_arg(
                f"shared memory size specified with the request for {what} ({size} bytes) should be at least "
                f"{len(data)} bytes to hold the results")
        with self._using(region, name) as fd:
            try:
                if os.fstat(fd).st_size < start + len(data):  # never grow a client's object
                    raise TritonError.invalid_arg(
                        f"{what}: shared memory region '{name}' is smaller than when it was registered")
                written = os.pwrite(fd, data, start)
            except OSError as e:
                raise TritonError.internal(f"{what}: writing shared memory region '{name}' failed: {e}") from None
        if written != len(data):
            raise TritonError.internal(f"{what}: short write to shared memory region '{name}'")

    def close(self) -> None:
        for region in self._pop_all():
            self._release(region)

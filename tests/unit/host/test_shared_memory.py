"""The system shared-memory registry: registration rules and bounds on every read and write."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.host.shared_memory import SharedMemoryRegistry
from triton_actor.protocol.shm_windows import parse_window, write_output


@pytest.fixture
def segment() -> Iterator[tuple[str, shared_memory.SharedMemory]]:
    seg = shared_memory.SharedMemory(f"ta_unit_{os.getpid()}", create=True, size=64)
    seg.buf[:64] = bytes(range(64))
    yield "/" + seg.name, seg
    seg.close()
    seg.unlink()


def _code(fn: object, *args: object) -> Code:
    with pytest.raises(TritonError) as e:
        fn(*args)  # type: ignore[operator]
    return e.value.code


def test_window_reads_and_writes_stay_inside(segment: tuple[str, shared_memory.SharedMemory]) -> None:
    key, seg = segment
    reg = SharedMemoryRegistry(allowed=True)
    reg.register_system("r", key, 16, 32)  # bytes 16..47 of the object
    assert reg.system_status() == [{"name": "r", "key": key, "offset": 16, "byte_size": 32}]
    assert bytes(reg.read("r", 0, 4, "x")) == bytes([16, 17, 18, 19])
    assert bytes(reg.read("r", 28, 4, "x")) == bytes([44, 45, 46, 47])
    for offset, size in ((29, 4), (-1, 4), (0, 33), (32, 1), (0, -1)):
        assert _code(reg.read, "r", offset, size, "x") == Code.INVALID_ARG
    reg.write("r", 4, 4, b"\xff\xff", "out")
    assert bytes(seg.buf[20:22]) == b"\xff\xff"
    assert _code(reg.write, "r", 30, 4, b"abcd", "out") == Code.INVALID_ARG  # past the window's end
    assert _code(reg.write, "r", 0, 2, b"abcd", "out") == Code.INVALID_ARG  # larger than the client's size
    assert write_output(reg, ("r", 8, 4), b"zz", "o") == {"shared_memory_region": "r", "shared_memory_byte_size": 2,
                                                          "shared_memory_offset": 8}
    reg.unregister_system()
    assert reg.system_status() == [] and _code(reg.read, "r", 0, 1, "x") == Code.NOT_FOUND


def test_registration_rules(segment: tuple[str, shared_memory.SharedMemory]) -> None:
    key, _ = segment
    reg = SharedMemoryRegistry(allowed=True)
    reg.register_system("a", key, 0, 64)
    assert _code(reg.register_system, "a", key, 0, 8) == Code.ALREADY_EXISTS
    assert _code(reg.register_system, "b", key, 0, 8) == Code.INVALID_ARG  # an active key under another name
    reg.unregister_system("a")
    assert _code(reg.register_system, "b", key, 60, 8) == Code.INVALID_ARG  # beyond the object's end
    assert _code(reg.register_system, "b", key, -1, 8) == Code.INVALID_ARG
    for bad_key in ("/a/b", "/..", "", "/", "..", 3):
        assert _code(reg.register_system, "b", bad_key, 0, 8) == Code.INVALID_ARG
    assert _code(reg.register_system, "b", "/ta_no_such_segment", 0, 8) == Code.INTERNAL
    assert _code(reg.system_status, "nope") == Code.NOT_FOUND
    reg.unregister_system("nope")  # unknown: a no-op
    assert reg.system_status() == []


def test_regions_are_bounded_and_the_refused_hold_no_descriptor() -> None:
    """Each region holds its object's descriptor: past ``max_regions`` a registration is refused (Triton's
    shape for a region it cannot map) before anything is opened; unregistering makes room again."""
    segs = [shared_memory.SharedMemory(f"ta_unit_{os.getpid()}_{i}", create=True, size=8) for i in range(4)]
    try:
        reg = SharedMemoryRegistry(allowed=True, max_regions=3)
        for i in range(3):
            reg.register_system(f"r{i}", "/" + segs[i].name, 0, 8)
        opened = len(os.listdir("/proc/self/fd"))
        with pytest.raises(TritonError) as e:
            reg.register_system("r3", "/" + segs[3].name, 0, 8)
        assert e.value.code == Code.INVALID_ARG
        assert e.value.message.startswith("failed to register shared memory region 'r3': 3 regions are registered")
        assert len(os.listdir("/proc/self/fd")) == opened and len(reg.system_status()) == 3
        reg.unregister_system("r0")
        reg.register_system("r3", "/" + segs[3].name, 0, 8)
        assert [r["name"] for r in reg.system_status()] == ["r1", "r2", "r3"]
        reg.close()
    finally:
        for seg in segs:
            seg.close()
            seg.unlink()


def test_everything_but_status_is_refused_unless_allowed(segment: tuple[str, shared_memory.SharedMemory]) -> None:
    key, _ = segment
    reg = SharedMemoryRegistry()
    for call in (lambda: reg.register_system("a", key, 0, 8), lambda: reg.read("a", 0, 1, "x"),
                 lambda: reg.write("a", 0, 1, b"x", "x"), reg.unregister_system,
                 lambda: reg.register_cuda("c", b"", 0, 8), reg.unregister_cuda):
        assert _code(call) == Code.UNSUPPORTED  # Triton's code for it
    assert reg.system_status() == [] and reg.cuda_status() == []  # Triton's status calls answer


def test_cuda_regions_are_unsupported_and_share_the_namespace(segment: tuple[str, shared_memory.SharedMemory]) -> None:
    key, _ = segment
    reg = SharedMemoryRegistry(allowed=True)
    assert _code(reg.register_cuda, "c", b"h" * 64, 0, 8) == Code.UNSUPPORTED
    # a handle that is not a cudaIpcMemHandle_t's 64 bytes: Triton's answer for a handle CUDA cannot open
    for bad in (b"", b"h", b"h" * 65, None, {"b64": "aA=="}):
        with pytest.raises(TritonError) as e:
            reg.register_cuda("c", bad, 0, 8)
        assert (e.value.code, e.value.message) == (Code.INVALID_ARG, "failed to register shared memory region: invalid args")
    reg.register_system("s", key, 0, 8)
    assert _code(reg.register_cuda, "s", b"h" * 64, 0, 8) == Code.ALREADY_EXISTS
    assert reg.cuda_status() == [] and _code(reg.cuda_status, "s") == Code.NOT_FOUND


def test_parse_window() -> None:
    assert parse_window("r", None, 8, "x") == ("r", 0, 8)
    for args in (("r", 0, None), (3, 0, 8), ("r", True, 8), ("r", 0, "8")):
        with pytest.raises(TritonError):
            parse_window(*args, "x")


def test_a_truncated_object_gives_errors_not_a_crash(segment: tuple[str, shared_memory.SharedMemory]) -> None:
    key, _ = segment
    reg = SharedMemoryRegistry(allowed=True)
    reg.register_system("r", key, 0, 64)
    os.truncate("/dev/shm/" + key.lstrip("/"), 8)  # the client shrinks its object after registering it
    assert _code(reg.read, "r", 0, 32, "x") == Code.INVALID_ARG
    assert _code(reg.write, "r", 16, 16, b"z" * 16, "out") == Code.INVALID_ARG
    assert bytes(reg.read("r", 0, 8, "x")) == bytes(range(8))  # what is still there reads fine
    assert os.stat("/dev/shm/" + key.lstrip("/")).st_size == 8  # and nothing grew it back


def test_a_region_unregistered_during_a_read_keeps_its_descriptor_until_the_read_ends(
        segment: tuple[str, shared_memory.SharedMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """Big requests are decoded on a native thread, which reads their regions there; the hub may
    unregister the region meanwhile. Closing its descriptor under the read would let the next
    registration reuse the number, and the read return another client's bytes (review finding)."""
    key, _seg = segment
    reg = SharedMemoryRegistry(allowed=True)
    reg.register_system("r", key, 0, 64)
    fd = reg._system["r"].fd
    real_preadv = os.preadv
    seen = []

    def preadv_while_unregistered(fd_: int, buffers: list[bytearray], offset: int) -> int:
        reg.unregister_system("r")  # as the hub would, while the read runs
        seen.append(os.fstat(fd_).st_size)  # still this region's descriptor, still open
        return real_preadv(fd_, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv_while_unregistered)
    assert bytes(reg.read("r", 8, 4, "x")) == bytes([8, 9, 10, 11]) and seen == [64]
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the read, its last user
    monkeypatch.setattr(os, "preadv", real_preadv)
    assert _code(reg.read, "r", 0, 4, "x") == Code.NOT_FOUND

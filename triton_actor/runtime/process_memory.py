"""How much memory this process and the processes under it hold, read from ``/proc`` (Linux).

Used to measure what a model's load added (the memory budget, plane/memory_budget.py, and ``triton-actor check``).
``unique=True`` counts each process's unique set size (``Private_Clean`` + ``Private_Dirty`` of
``smaps_rollup``): a forked child (an isolated Python model) shares its parent's pages until it writes
them, and its RSS would charge the model with the whole server. ``unique=False``: the resident set size.
A process that ends while being read is skipped. Reading walks ``/proc``: a few milliseconds, fine
around a load, never on a request's path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from pathlib import Path
from typing import Any


def tree_pids(root: int | None = None) -> set[int]:
    """``root`` (this process by default) and every process below it."""
    pids = {root or os.getpid()}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in pids} - pids
        pids |= more
        grew = bool(more)
    return pids


def process_bytes(pid: int, unique: bool = False) -> int:
    """One process's resident (or unique) bytes; 0 when it is gone."""
    try:
        if unique:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            return sum(int(line.split()[1]) * 1024 for line in text.splitlines()
                       if line.startswith(("Private_Clean:", "Private_Dirty:")))
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("VmRSS:")), 0)


def tree_bytes(unique: bool = False) -> int:
    """Resident (or unique) bytes of this process and every process below it."""
    return sum(process_bytes(pid, unique) for pid in tree_pids())


def release_free_memory() -> None:
    """Give what an unloaded model freed back to the system before the next load is measured: a cycle
    may still hold its arrays (``gc.collect``), and glibc keeps freed heap pages (arrays under its
    mmap threshold, which rises to 32 MiB after large frees, and per-thread arenas) until
    ``malloc_trim``. Without it the process grows past the budget while the accounting shrinks."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Give glibc's free heap pages back to the system (``malloc_trim``), without a collection: after a load
    whose override text and its parses (a few MiB each) were freed, glibc kept them (its trim threshold
    rises with its mmap threshold after large frees) and a gRPC load held 13 MB once loaded where 7 were
    the model's (``scripts/probe_degraded.py config-override --mib 3.9 --grpc``)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def return_large_frees(threshold: int = 1 << 20) -> None:
    """Make glibc map every allocation of ``threshold`` bytes or more on its own, so that freeing it gives
    it back at once: by default the threshold rises after each large free (up to 32 MiB) and a model's
    arrays land in heaps that keep their pages after it is unloaded, where the next load reuses them
    unseen (measured as zero) while the process holds both. Setting it fixes it (no more rising)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, threshold)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS): nothing to trim
        return None


_LIBC = _libc()

"""How much memory this process and the processes under it hold, read from ``/proc`` (Linux).

Used to measure what a model's load added (the memory budget, plane/budget.py, and ``triton-actor check``).
``unique=True`` counts each process's unique set size (``Private_Clean`` + ``Private_Dirty`` of
``smaps_rollup``): a forked child (an isolated Python model) shares its parent's pages until it writes
them, and its RSS would charge the model with the whole server. ``unique=False``: the resident set size.
A process that ends while being read is skipped. Reading walks ``/proc``: a few milliseconds, fine
around a load, never on a request's path.
"""

from __future__ import annotations

import os
from pathlib import Path


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

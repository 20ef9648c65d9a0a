"""What a model directory looks like on disk, as a value: change detection for reloads and POLL.

A :class:`Stamp` lists every file under a model directory with its size and modification time
(Triton compares only the newest mtime of the directory and its direct children, which misses a file
rewritten in place with an older mtime and a deeper file changing). Two stamps compare equal when
nothing was added, removed, resized or touched. Pure functions over the file system; they read only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from . import layout

FileEntry = tuple[str, int, int]  # relative path, size, mtime_ns


@dataclass(frozen=True, slots=True)
class Stamp:
    """The files of one model directory, sorted by relative path."""

    files: tuple[FileEntry, ...]

    def part(self, top: str) -> tuple[FileEntry, ...]:
        """The entries under the direct child ``top`` (e.g. a version folder)."""
        prefix = top + "/"
        return tuple(f for f in self.files if f[0].startswith(prefix))

    def shared(self, version_dirs: set[str], ignore: frozenset[str] = frozenset()) -> tuple[FileEntry, ...]:
        """The entries outside the version folders (labels, ``configs/``, ``warmup/``...), minus ``ignore``."""
        return tuple(f for f in self.files if f[0].split("/", 1)[0] not in version_dirs and f[0] not in ignore)

    def outside_versions(self) -> tuple[FileEntry, ...]:
        """The entries outside every version folder but the config files (labels, warmup data): what a reload
        must pick up; configs are compared parsed, so a ``version_policy`` edit reloads no other version."""
        return tuple(f for f in self.files if layout.parse_version(f[0].split("/", 1)[0]) is None
                     and f[0] != "config.pbtxt" and not f[0].startswith("configs/"))

    def digest(self) -> str:
        """A short text that is equal for equal stamps: what another worker process compares with its own
        stamp of the same folder (same files, sizes and modification times)."""
        return hashlib.blake2b(repr(self.files).encode(), digest_size=16).hexdigest()


def take(model_dir: Path) -> Stamp:
    """Walk ``model_dir`` (symlinks followed, as the loaders follow them); unreadable entries are skipped."""
    entries: list[FileEntry] = []
    base = str(model_dir)
    seen: set[tuple[int, int]] = set()  # directories already walked: a symlink cycle must not loop forever
    for root, dirs, files in os.walk(base, followlinks=True):
        try:
            st = os.stat(root)
        except OSError:
            dirs.clear()
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        rel_root = os.path.relpath(root, base)
        for name in files:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # removed while we walked: the next scan sees the settled state
            entries.append((rel.replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
    entries.sort()
    return Stamp(tuple(entries))


def version_dirs(model_dir: Path) -> dict[int, str]:
    """Version number → folder name (the name stamps use)."""
    return {v: p.name for v, p in layout.list_versions(model_dir).items()}

"""Model repository layout rules (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md): which folders are models and which are versions.

Pure functions over the file system; they read, never write.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# Folders inside a model directory that are never versions (Triton skips them by name).
_NOT_VERSIONS = frozenset({"warmup", "initial_state", "configs"})
_LEADING_DIGITS = re.compile(r"\d+")
_VALID_NAME = re.compile(r"^[^/\\\x00]+$")


def is_valid_model_name(name: str) -> bool:
    """A model name is one path segment: no separators, not ``.``/``..``, not hidden."""
    return bool(_VALID_NAME.match(name)) and name not in (".", "..") and not name.startswith(".")


def is_plain_file_name(name: str) -> bool:
    """One path segment naming a file: no separator, no NUL, not ``.``/``..``."""
    return bool(_VALID_NAME.match(name)) and name not in (".", "..")


def model_file(model: str, version_dir: Path, filename: str, what: str) -> Path:
    """The model file ``filename`` (``default_model_filename`` or the backend's default) of a version:
    the one way a backend finds what it reads, compiles or imports. It must be a plain file name whose
    resolved path stays inside the version folder, whatever a config or a load request says (an absolute
    path, ``..``, or a symlink out of the folder is refused before anything is opened)."""
    from ..errors import TritonError

    if not is_plain_file_name(filename):
        raise TritonError.invalid_arg(
            f"model '{model}': default_model_filename '{filename}' must be a file name inside the version folder")
    path = version_dir / filename
    folder = version_dir.resolve()
    try:
        inside = path.resolve().is_relative_to(folder)
    except OSError:
        inside = False
    if not inside:
        raise TritonError.invalid_arg(f"model '{model}': {what} {path} is outside its version folder")
    if not path.is_file():
        raise TritonError.invalid_arg(f"model '{model}': {what} {path} does not exist")
    return path


def list_models(repositories: Sequence[Path]) -> dict[str, list[Path]]:
    """Every model folder of every repository, name → the folders holding it (more than one = duplicate)."""
    found: dict[str, list[Path]] = {}
    for repo in repositories:
        try:
            entries = sorted(os.scandir(repo), key=lambda e: e.name)
        except OSError as e:
            log.error("cannot read model repository %s: %s", repo, e)
            continue
        for entry in entries:
            if entry.is_dir() and is_valid_model_name(entry.name):
                found.setdefault(entry.name, []).append(Path(entry.path))
    return found


def parse_version(name: str) -> int | None:
    """A version folder name → its number, or None when Triton would ignore the folder.

    Mirrors Triton: ``0`` is valid, ``01`` (leading zero, longer than one char) is ignored, and
    parsing is ``std::stoll``-like, so ``3abc`` is version 3.
    """
    if name in _NOT_VERSIONS or (len(name) > 1 and name.startswith("0")):
        return None
    m = _LEADING_DIGITS.match(name)
    return None if m is None else int(m.group())


def list_versions(model_dir: Path) -> dict[int, Path]:
    """Version number → folder, for the numeric sub-folders of ``model_dir``."""
    versions: dict[int, Path] = {}
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError:
        return versions
    for entry in entries:
        if not entry.is_dir():
            continue
        v = parse_version(entry.name)
        if v is None:
            if entry.name not in _NOT_VERSIONS:
                log.warning("ignoring '%s' in %s: not a valid version folder name", entry.name, model_dir)
            continue
        versions.setdefault(v, Path(entry.path))
    return versions


def select_versions(policy_kind: str, policy_arg: Iterable[int] | int, available: Iterable[int]) -> list[int]:
    """Apply a ``version_policy`` to the versions on disk; ascending order.

    ``policy_kind`` is ``latest`` (arg: num_versions), ``all`` or ``specific`` (arg: the versions).
    """
    have = sorted(available)
    if policy_kind == "all":
        return have
    if policy_kind == "specific":
        wanted = set(policy_arg)  # type: ignore[arg-type]
        missing = wanted.difference(have)
        for v in sorted(missing):
            log.warning("version %d named by version_policy.specific does not exist", v)
        return [v for v in have if v in wanted]
    n = int(policy_arg)  # type: ignore[arg-type]
    return have[-n:] if n > 0 else []


def read_labels(path: Path) -> list[str]:
    """One label per line, index = line number (classification extension)."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def contained(base: Path, candidate: Path) -> bool:
    """True when ``candidate`` resolves inside ``base`` (symlinks followed): guards file names from configs."""
    try:
        candidate.resolve().relative_to(base.resolve())
    except ValueError:
        return False
    return True

"""The load API's overrides (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md): a ``config`` JSON and ``file:<path>`` contents.

Files are written into a fresh private temporary model directory, never into a repository. Every
path is checked before anything is written: relative, no ``..``, no empty or hidden-parent tricks,
and the result must stay inside the temporary directory (which holds only what we create there, so
no symlink can point out of it; files are opened with ``O_NOFOLLOW | O_EXCL`` all the same).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from ..errors import TritonError
from . import config as config_mod
from .config import ModelConfig

FILE_PREFIX = "file:"
# bytes of a ``config`` override: a model configuration of thousands of fields is tens of KiB, and one
# is held several times over while it loads (the request's body and text, JSON objects while it is
# parsed, the message, the JSON the backend gets): 103 MB peaked at 928 MB and kept 550 MB while the
# model was loaded, before the normalized copy went (the message is completed in place: a 3.9 MiB
# override peaked at 7.9 times its size, 5.5, then 4.8 once the text went at its parse,
# scripts/trace_config_override.py; peak RSS 2.7 times its body since the front ends let go of the
# body and message once parsed, scripts/probe_degraded.py config-override)
MAX_CONFIG_BYTES = 4 * 1024 * 1024
_OBJECT_START = re.compile(r"\s*\{")


def check_config_size(model: str, text: str) -> None:
    """Refuse a ``config`` override over :data:`MAX_CONFIG_BYTES` before anything parses or copies it."""
    if len(text) > MAX_CONFIG_BYTES:
        raise TritonError.invalid_arg(
            f"failed to load '{model}': the 'config' parameter is {len(text)} characters, more than the "
            f"{MAX_CONFIG_BYTES} a model configuration override may have")


class ConfigText:
    """A ``config`` override's text handed from the front end to its one parse, which takes it: the slot
    is cleared then, so the text goes as soon as it is parsed instead of living, referenced from the
    front end's parameters and the messages on the way, until the load finished (issue 23: one more
    copy of the override for the whole load). One process only: ``--workers`` journals the text."""

    __slots__ = ("_text", "size")

    def __init__(self, text: str) -> None:
        self._text: str | None = text
        self.size = len(text)

    def take(self) -> str:
        text, self._text = self._text, None
        if text is None:
            raise TritonError.internal("a load's config override was parsed twice")
        return text

    def __len__(self) -> int:
        return self.size


def take_text(config: str | ConfigText) -> str:
    """The text of a ``config`` override given as text, or taken from its holder (:class:`ConfigText`);
    called by the parse (:func:`parse_config`), never bound by a caller, so that a holder's text goes
    once read."""
    return config.take() if isinstance(config, ConfigText) else config


def parse_config(model: str, config: str | ConfigText) -> ModelConfig:
    """The ``config`` parameter: ModelConfig JSON with proto field names; anything else is INVALID_ARG.
    A holder's text is taken by the JSON parse itself, so it goes once read (issue 23)."""

    def text() -> str:
        taken = take_text(config)
        # not strip(): an override with a trailing newline was copied whole before it was parsed
        if not isinstance(taken, str) or _OBJECT_START.match(taken) is None:
            raise TritonError.invalid_arg("Invalid config override: the 'config' parameter must be a JSON object")
        return taken

    cfg = config_mod.parse_json(text, model)
    if cfg.name and cfg.name != model:
        raise TritonError.invalid_arg(
            f"the config override names model '{cfg.name}', expected '{model}'")
    return cfg


def check_path(model: str, key: str) -> PurePosixPath:
    """``file:<version>/<name>`` → the relative path, or INVALID_ARG when it could leave the model directory."""
    rel = key[len(FILE_PREFIX):]
    path = PurePosixPath(rel)
    bad = (not rel or "\\" in rel or "\x00" in rel or rel.startswith("/") or path.is_absolute()
           or any(part in ("", ".", "..") for part in rel.split("/")))
    if bad:
        raise TritonError.invalid_arg(
            f"invalid file override '{key}': the path must be relative to the model directory, without '..' "
            "or empty parts")
    return path


def materialize(model: str, files: dict[str, bytes]) -> Path:
    """Write the overrides into a new temporary model directory and return it (the caller owns it)."""
    paths = {key: check_path(model, key) for key in files}
    root = Path(tempfile.mkdtemp(prefix=f"triton_actor_{model}_"))
    try:
        for key, rel in paths.items():
            target = root.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not _inside(root, target):
                raise TritonError.invalid_arg(f"file override '{key}' leaves the model directory")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(files[key])
    except OSError as e:
        shutil.rmtree(root, ignore_errors=True)
        raise TritonError.invalid_arg(f"cannot write file override: {e}") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _inside(root: Path, target: Path) -> bool:
    try:
        target.parent.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True

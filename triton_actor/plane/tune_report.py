"""The last tuning run's report, as ``triton-actor tune --url`` told this server (``POST /v2/tune/report``):
the live status page links it and ``/tune/report/`` serves its folder read-only.

The server only serves what a report holds: files directly in the registered folder (no sub-folders),
named as the report writer names them (``index.html``, ``points.csv``, ``summary.json``, the PNG plots,
``tuned*.pbtxt``), regular files whose real path is inside the folder (a symbolic link out of it is
refused), at most ``MAX_FILE_BYTES`` each. A folder is taken only when it looks like a report: a
``summary.json`` with the writer's keys and an ``index.html``. The path is what the tuner, on this host,
wrote; a client that can reach the model-control API could load a Python model (code) anyway, so the
route sits in the ``model-repository`` restricted-API category with the load API.

State per process; ``set`` runs on every worker through ``host.broadcast`` (a worker started later does
not know the report until the next run tells it). Runs in request greenlets; the files are small (a
report of 200 points is about 100 KiB), read whole.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import TritonError

ROUTE = "tune/report/"  # relative to the status page, which sits at the root
MAX_FILE_BYTES = 8 << 20  # the biggest report file (a PNG plot) is about 100 KiB; anything near this is not ours
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.(html|csv|json|png|pbtxt)")
CONTENT_TYPES = {"html": "text/html; charset=utf-8", "csv": "text/csv; charset=utf-8", "json": "application/json",
                 "png": "image/png", "pbtxt": "text/plain; charset=utf-8"}


class TuneReport:
    def __init__(self) -> None:
        self.folder: Path | None = None
        self.summary: dict[str, Any] = {}

    def set(self, path: str) -> dict[str, Any]:
        """Take ``path`` as the last run's report folder (INVALID_ARG when it is not one); its status."""
        folder = Path(path)
        if not folder.is_absolute():
            raise TritonError.invalid_arg(f"the tune report folder must be an absolute path, got '{path}'")
        try:
            folder = folder.resolve(strict=True)
            summary = json.loads(_small_file(folder / "summary.json").decode("utf-8"))
        except (OSError, ValueError) as e:
            raise TritonError.invalid_arg(f"'{path}' is not a tune report folder: {e}") from None
        if not isinstance(summary, dict) or not {"model", "verdict"} <= summary.keys() \
                or not (folder / "index.html").is_file():
            raise TritonError.invalid_arg(f"'{path}' is not a tune report folder (no summary.json of tune, or no index.html)")
        self.folder, self.summary = folder, summary
        return self.status() or {}

    def status(self) -> dict[str, Any] | None:
        """What ``/status.json`` shows: the model, the verdict, where the report is served."""
        if self.folder is None:
            return None
        return {"model": str(self.summary.get("model", "")), "verdict": str(self.summary.get("verdict", "")),
                "url": ROUTE}

    def file(self, name: str) -> tuple[bytes, str]:
        """The content of the report's file ``name`` and its content type; NOT_FOUND for anything else."""
        name = name or "index.html"
        match = _NAME.fullmatch(name)
        if self.folder is None or match is None:
            raise TritonError.not_found(f"no tune report file '{name}'")
        try:
            path = (self.folder / name).resolve(strict=True)
            if path.parent != self.folder:
                raise OSError("outside the report")
            return _small_file(path), CONTENT_TYPES[match.group(1)]
        except OSError:
            raise TritonError.not_found(f"no tune report file '{name}'") from None


def _small_file(path: Path) -> bytes:
    """A regular file's bytes, at most MAX_FILE_BYTES: the folder is a client's word, so its summary.json may be
    a FIFO (a read that never ends) or a link to a device that never runs out."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer (a regular file reads as without it)
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            raise OSError(f"{path.name} is not a regular file of at most {MAX_FILE_BYTES} bytes")
        return f.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES]

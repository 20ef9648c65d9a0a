"""What ``triton-actor check`` found for one model, and how it is shown: one line per model (with the
rest of an error's text and the warnings indented below it), or a JSON document for CI.

Pure values; runs in the checker's own process. A model is FAIL when it did not load or its request
failed (or, with ``--strict``, when it has a warning), WARN when it loaded but something will fail only
elsewhere, OK otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL = "OK", "WARN", "FAIL"

# where a message names its source: a Python frame as Triton's python backend writes it ("path(12): fn",
# innermost first), a traceback line, or a config.pbtxt syntax error ("path:3:7")
_PY_FRAME = re.compile(r"(\S+\.py)\((\d+)\)")
_TRACEBACK = re.compile(r'File "([^"]+)", line (\d+)')
_PBTXT = re.compile(r"(\S+\.pbtxt):(\d+)(?::\d+)?")


@dataclass(slots=True)
class Failure:
    """Triton's text for why the model failed, with the file and line it names where it names one."""

    message: str
    file: str | None = None
    line: int | None = None

    @classmethod
    def from_text(cls, message: str, roots: Sequence[str] = ()) -> Failure:
        """The first place ``message`` names, preferring one inside ``roots`` (the repositories: the
        model's own frame rather than the library frame it called last)."""
        found = [m for pattern in (_PY_FRAME, _TRACEBACK, _PBTXT) for m in pattern.finditer(message)]
        ours = [m for m in found if any(m.group(1).startswith(str(r)) for r in roots)]
        for m in ours or found[:1]:
            return cls(message, m.group(1), int(m.group(2)))
        return cls(message)


@dataclass(slots=True)
class ModelResult:
    """One model's outcome; ``footprint_bytes`` is the RSS its load and first request added (the child
    process and the processes it started), ``exercised`` says what ran: its model_warmup or a request."""

    name: str
    load_s: float | None = None
    footprint_bytes: int | None = None
    exercised: str | None = None
    infer_ms: float | None = None
    error: Failure | None = None
    warnings: list[str] = field(default_factory=list)
    status: str = OK

    def settle(self, strict: bool) -> ModelResult:
        self.status = FAIL if self.error is not None or (strict and self.warnings) else WARN if self.warnings else OK
        return self


def line(result: ModelResult, width: int) -> str:
    """The model's line, then the rest of an error's text and the warnings, indented."""
    head = f"{result.status:<5} {result.name:<{width}}"
    more: list[str] = []
    if result.error is not None:
        first, *rest = result.error.message.splitlines() or [""]
        where = f"{result.error.file}:{result.error.line}: " if result.error.file else ""
        head += f"  {where}{first}"
        more += [text for text in rest if text.strip()]
    else:
        head += f"  load {result.load_s:.2f} s  {_mib(result.footprint_bytes)}  {result.exercised}"
        if result.infer_ms is not None:
            head += f" ({result.infer_ms:.1f} ms)"
    more += [f"warning: {w}" for w in result.warnings]
    return "\n".join([head, *(f"      {text.strip()}" for text in more)])


def summary(results: list[ModelResult]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in (OK, WARN, FAIL)}
    return f"{len(results)} model(s): {counts[OK]} OK, {counts[WARN]} with warnings, {counts[FAIL]} failed"


def document(repositories: list[str], strict: bool, results: list[ModelResult]) -> dict[str, Any]:
    """The ``--json`` output."""
    return {"repositories": repositories, "strict": strict, "ok": all(r.status != FAIL for r in results),
            "models": [asdict(r) for r in sorted(results, key=lambda r: r.name)]}


def _mib(n: int | None) -> str:
    return "rss ?" if n is None else f"rss {'+' if n >= 0 else '-'}{abs(n) / 2**20:.1f} MiB"

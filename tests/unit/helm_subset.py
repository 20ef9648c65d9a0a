"""Render deploy/helm's chart without helm (not on the registries): the small subset of Helm's Go templates
the chart uses, and nothing more — anything else raises, so a chart edit beyond the subset fails the tests
instead of rendering wrongly.

Subset: ``{{ .Values.a.b }}``, ``.Release.Name``, ``.Release.Namespace``, ``.Chart.<field>``; pipelines with
``quote``, ``toYaml``, ``nindent N``, ``indent N``; ``if`` / ``else`` / ``end`` (Go's truthiness); ``{{-`` and
``-}}`` trim whitespace as in Go.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


def _tokens(text: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) in order, with Go's whitespace trimming applied."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        out.append(("text", chunk))
        out.append(("action", m.group(2)))
        trim_next, pos = bool(m.group(3)), m.end()
    tail = text[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _lookup(path: str, scope: dict[str, Any]) -> Any:
    if not path.startswith("."):
        raise ValueError(f"unsupported template value {path!r}")
    value: Any = scope
    for part in path[1:].split("."):
        if not isinstance(value, dict) or part not in value:
            return None  # Go templates print <no value>; helm renders missing values as empty
        value = value[part]
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _apply(func: str, args: list[str], value: Any) -> Any:
    if func == "quote":
        return '"' + _text(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if func == "toYaml":
        return yaml.safe_dump(value, default_flow_style=False, sort_keys=False).rstrip("\n")
    if func in ("nindent", "indent"):
        pad = " " * int(args[0])
        body = "\n".join(pad + line for line in _text(value).split("\n"))
        return "\n" + body if func == "nindent" else body
    raise ValueError(f"unsupported template function {func!r}")


def _evaluate(expr: str, scope: dict[str, Any]) -> Any:
    stages = [s.split() for s in expr.split("|")]
    first = stages[0]
    value = _lookup(first[0], scope) if len(first) == 1 else _apply(first[0], [], _lookup(first[1], scope))
    for stage in stages[1:]:
        value = _apply(stage[0], stage[1:], value)
    return value


def render_template(text: str, scope: dict[str, Any]) -> str:
    out: list[str] = []
    emitting: list[bool] = []  # one entry per open `if`: is this branch being rendered
    for kind, body in _tokens(text):
        on = all(emitting)
        if kind == "text":
            if on:
                out.append(body)
        elif body.startswith("if "):
            emitting.append(on and bool(_evaluate(body[3:], scope)))
        elif body == "else":
            emitting[-1] = not emitting[-1] and all(emitting[:-1])
        elif body == "end":
            emitting.pop()
        elif body.startswith("/*"):
            continue
        elif on:
            out.append(_text(_evaluate(body, scope)))
    if emitting:
        raise ValueError("unclosed {{ if }}")
    return "".join(out)


def render_chart(chart: Path, release: str = "release", namespace: str = "default",
                 values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template file name → rendered text, as ``helm template RELEASE CHART`` would write them."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    merged = _merge(yaml.safe_load((chart / "values.yaml").read_text()) or {}, values or {})
    scope = {"Values": merged, "Release": {"Name": release, "Namespace": namespace},
             "Chart": {k[:1].upper() + k[1:]: v for k, v in meta.items()}}
    return {p.name: render_template(p.read_text(), scope) for p in sorted((chart / "templates").glob("*.yaml"))}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out

"""Request headers forwarded to the model as parameters (Triton's ``--http-header-forward-pattern`` and
``--grpc-header-forward-pattern``; docs/protocol/extension_parameters.md, "Forwarding HTTP/GRPC Headers
as Parameters").

Triton's rule, kept here: a header whose *name* the regular expression matches anywhere (RE2's
PartialMatch: ``re.search``) becomes a string parameter of that name with the header's value; the match
ignores case unless the pattern starts with ``(?-i)``. Triton sets the forwarded headers after the
request's own parameters, so a header wins over a body parameter of the same name. A forwarded header
named as a parameter Triton reserves (``sequence_id``, ``priority``, ``timeout``, ``triton_*`` ...) is
refused, as Triton's server does ("reserved for Triton usage"). HTTP header names arrive lower-cased
(HTTP/1.1 names are case-insensitive; Python's clients lower-case them too), gRPC metadata keys are
lower-case on the wire; pseudo-headers and gRPC's own (``grpc-*``, ``te``, ``content-type``) are not
client metadata and never forwarded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import TritonError

_CASE_SENSITIVE = "(?-i)"
RESERVED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"})
_TRANSPORT = frozenset({"te", "content-type"})


def compile_pattern(pattern: str) -> re.Pattern[str] | None:
    """``pattern`` as Triton reads it; None for "" (nothing is forwarded). Raises ValueError."""
    if not pattern:
        return None
    flags = re.IGNORECASE
    if pattern.startswith(_CASE_SENSITIVE):  # RE2's global flag; Python's re takes only scoped (?-i:...)
        pattern, flags = pattern[len(_CASE_SENSITIVE):], 0
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise ValueError(f"invalid regular expression '{pattern}': {e}") from None


def forwarded(regex: re.Pattern[str] | None, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The parameters ``headers`` (name, value) give under ``regex``; raises INVALID_ARG for a reserved name."""
    if regex is None:
        return {}
    out = {}
    for name, value in headers:
        if name.startswith(":") or name.startswith("grpc-") or name in _TRANSPORT or not regex.search(name):
            continue
        if name in RESERVED or name.startswith("triton_"):
            raise TritonError.invalid_arg(f"header '{name}' is forwarded as a parameter, and that name is "
                                          "reserved for Triton usage")
        out[name] = value
    return out


def with_forwarded(request: Any, params: dict[str, str]) -> Any:
    """``request`` (an :class:`~triton_actor.inference.InferRequest`) with ``params`` over its own parameters."""
    return request._replace(parameters={**request.parameters, **params}) if params else request


# The W3C ``traceparent`` of a gRPC call rides with the forwarded metadata to the servicer under a key no
# header can have (names hold no spaces), and is taken out there before the rest becomes parameters.
_TRACE_KEY = " traceparent"


def with_trace(forwarded: dict[str, Any] | None, traceparent: Any) -> dict[str, Any]:
    """``traceparent``: the header's text, or the front end's object that carries it (a WireTrace)."""
    return {**(forwarded or {}), _TRACE_KEY: traceparent}


def split_trace(forwarded: dict[str, Any] | None) -> tuple[dict[str, str], Any]:
    """(the parameters to forward, the ``traceparent`` :func:`with_trace` put in, or None)."""
    if not forwarded or _TRACE_KEY not in forwarded:
        return forwarded or {}, None
    params = dict(forwarded)
    return params, params.pop(_TRACE_KEY)

"""Bodies of the repository extension's load and unload requests over HTTP (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md), sans I/O.

``{"parameters": {"config": "<ModelConfig JSON>", "file:1/model.py": "<base64>"}}`` for load and
``{"parameters": {"unload_dependents": true}}`` for unload; an empty body means no parameters.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from ..errors import TritonError

FILE_PREFIX = "file:"


def _parameters(body: bytes) -> dict[str, Any]:
    if not body or body.isspace():  # not strip(): a body with a trailing newline was copied whole
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        # Triton answers a malformed load/unload body with 500 (scripts/triton_reference/NOTES.md)
        raise TritonError.internal(f"failed to parse the request JSON buffer: {e}") from None
    # Triton answers these with 500 and rapidjson's words; ours say what was expected
    if not isinstance(data, dict):
        raise TritonError.internal("attempt to get members for non-object: the request body must be a JSON object")
    params = data.get("parameters", {})
    if not isinstance(params, dict):
        raise TritonError.internal("attempt to get members for non-object: 'parameters' must be a JSON object")
    return params


def decode_load(body: bytes) -> dict[str, Any]:
    """→ ``{"config": str, "file:<path>": bytes, ...}`` as ``DataPlane.load_model`` takes it."""
    out: dict[str, Any] = {}
    for key, value in _parameters(body).items():
        if key == "config":
            if not isinstance(value, str):
                raise TritonError.internal("attempt to access JSON non-string as string: the 'config' parameter "
                                           "must be a string holding the ModelConfig JSON")
            out[key] = value
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, str):
                raise TritonError.invalid_arg(f"file override '{key}' must be a base64 string")
            try:
                out[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise TritonError.invalid_arg(f"file override '{key}' is not valid base64") from None
        else:
            out[key] = value
    return out


def decode_unload(body: bytes) -> bool:
    """→ ``unload_dependents``; a value that is not a bool counts as false, as in Triton."""
    value = _parameters(body).get("unload_dependents", False)
    return value if isinstance(value, bool) else False

"""Parameters of requests and responses: the check their constructors run and the JSON text
``parameters()`` returns.

Owner: the request or response that holds them. Parameters are kept as given (a dict, a JSON string
or None); the JSON text of a dict is made on the first ``parameters()`` call and cached on the
object, so a model that never asks pays nothing. Failure: a value of a type Triton does not accept
raises ``TypeError`` that is also a ``TritonModelException``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import _ArgTypeError


def check_parameters(parameters: Any, allow_float: bool) -> None:
    """Validate parameters: None, a JSON string, or a dict of str -> bool/int/str.

    Requests also accept floats: Triton hands DOUBLE request parameters to models.
    """
    if parameters is None or isinstance(parameters, str):
        return
    if not isinstance(parameters, Mapping):
        raise _ArgTypeError(
            f"parameters must be a dict or a JSON string, got {type(parameters).__name__}"
        )
    allowed = (bool, int, str, float) if allow_float else (bool, int, str)
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise _ArgTypeError(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, allowed):
            raise _ArgTypeError(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value)}"
            )


class JsonParameters:
    """Gives requests and responses ``parameters()``; the class sets ``_parameters`` in its constructor."""

    _parameters: dict[str, Any] | str | None
    _parameters_json: str | None = None  # class default: set on first parameters() with a dict

    def parameters(self) -> str:
        """Return the parameters as a JSON object string."""
        params = self._parameters
        if params is None:
            return "{}"
        if isinstance(params, str):
            return params
        text = self._parameters_json
        if text is None:
            text = json.dumps(params)
            self._parameters_json = text
        return text

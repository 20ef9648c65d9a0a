"""Triton's ``identity`` backend (https://github.com/triton-inference-server/identity_backend), in Python.

Triton's own tests serve models with ``backend: "identity"`` (``custom_identity_int32`` and its kind in
``qa/L0_parameters``, ``L0_request_cancellation``, ``L0_client_timeout`` and others); the backend is C++ and
ships with neither Triton's PyPI build nor its release image. What it does, as its source does it: the
n-th output of the config is the n-th input of the request (same data, type and shape), each execution
waits ``execute_delay_ms`` (a model parameter) first, and each instance ``creation_delay_sec`` while it is
created. No file is read: a version folder is all the model needs.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..repository.config import ModelConfig
from ..runtime.threads import native_sleep
from .base import InstanceContext, Result


def _number(config: ModelConfig, key: str) -> float:
    param = config.parameters.get(key)
    if param is None or not param.string_value:
        return 0.0
    try:
        return max(0.0, float(param.string_value))
    except ValueError:
        raise TritonError.invalid_arg(
            f"model '{config.name}': parameter '{key}' must be a number, got '{param.string_value}'") from None


class IdentityBackend:
    name = "identity"

    def __init__(self, backend_config: dict[str, dict[str, str]] | None = None) -> None:
        pass

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                      explicit: frozenset[str] = frozenset()) -> None:
        """Nothing to tell: the config says every input and output."""

    def create(self, ctx: InstanceContext) -> IdentityInstance:
        return IdentityInstance(ctx.config)


class IdentityInstance:
    """One instance: outputs by position from the request's inputs by position (the config's order)."""

    def __init__(self, config: ModelConfig) -> None:
        if len(config.output) > len(config.input):
            raise TritonError.invalid_arg(
                f"model '{config.name}': the identity backend needs an input for each output "
                f"({len(config.input)} inputs, {len(config.output)} outputs)")
        self.pairs = [(i.name, o.name) for i, o in zip(config.input, config.output, strict=False)]
        self.delay = _number(config, "execute_delay_ms") / 1000
        native_sleep(_number(config, "creation_delay_sec"))  # on the instance's own thread, as Triton's
        # a delayed model must not wait on the hub: it runs on its instance's thread (actors/scheduling/instance.py)
        self.inline_ok = self.delay == 0

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        if self.delay:  # (not inline: on the instance's own thread)
            native_sleep(self.delay)
        results: list[Result] = []
        for request in requests:
            inputs = request.inputs
            results.append(InferResponse([(out, inputs[inp].data) for inp, out in self.pairs if inp in inputs]))
        return results

    def finalize(self) -> None:
        pass

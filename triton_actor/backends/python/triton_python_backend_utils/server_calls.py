"""What a model asks of the server: BLS (``InferenceRequest.exec`` / ``async_exec``) and model control
(``load_model``, ``unload_model``, ``is_model_ready``).

Owner: each server's :class:`~.serving.ServerHooks` (``serving.py``: how a call finds the server whose
model made it), which the server fills at start and empties at stop (``triton_actor/plane/calls_from_models.py``):

* ``bls_executor(request, decoupled)`` -- runs ``InferenceRequest.exec``; returns an
  ``InferenceResponse`` (or an iterator of them when ``decoupled`` is true).
* ``bls_async_executor(request, decoupled)`` -- optional; returns an awaitable for
  ``InferenceRequest.async_exec``. Without it ``async_exec`` runs ``bls_executor`` at once and hands
  back a completed future.
* ``model_control`` -- an object with ``load_model(name, config, files)``,
  ``unload_model(name, unload_dependents)`` and ``is_model_ready(name, version)``.

Thread: the calls run on the calling model's instance thread (or a thread the model started); the
hooks are read on every call, never cached. The server's ``bls_async_executor`` returns a future of
the running loop that the hub completes (the loop is not blocked while the call runs). Failure: while a hook is unset the call raises
``TritonModelException`` ("... is not supported by this server yet"); what a hook raises reaches the
model unchanged (through the future for ``async_exec``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .errors import TritonModelException
from .serving import check_bls_allowed, current


def bls_exec(request: Any, decoupled: bool) -> Any:
    """``InferenceRequest.exec``: run ``request`` on its ``model_name`` through the server."""
    check_bls_allowed()
    executor = current().bls_executor
    if executor is None:
        raise TritonModelException("BLS is not supported by this server yet")
    return executor(request, decoupled)


def bls_async_exec(request: Any, decoupled: bool) -> Any:
    """``InferenceRequest.async_exec``: an awaitable of what ``bls_exec`` returns."""
    check_bls_allowed()
    hooks = current()
    async_executor = hooks.bls_async_executor
    if async_executor is not None:
        return async_executor(request, decoupled)
    executor = hooks.bls_executor
    if executor is None:
        raise TritonModelException("BLS is not supported by this server yet")
    # No executor threads: under gevent's patching they would be greenlets that the asyncio loop
    # starves. Run the (blocking) BLS call now and hand back a completed future.
    future = asyncio.get_running_loop().create_future()
    try:
        future.set_result(executor(request, decoupled))
    except Exception as e:  # noqa: BLE001 - delivered through the future
        future.set_exception(e)
    return future


def _model_controller() -> Any:
    control = current().model_control
    if control is None:
        raise TritonModelException(
            "model control from python models is not supported by this server yet"
        )
    return control


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``; EXPLICIT model-control mode only."""
    _model_controller().load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name``; EXPLICIT model-control mode only."""
    _model_controller().unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Return True if ``model_name`` (optionally a version) is ready."""
    return bool(_model_controller().is_model_ready(model_name, model_version))

"""Which server a model's call belongs to: the :class:`ServerHooks` each server gives the models it runs.

Owner: each server owns one :class:`ServerHooks` (its BLS and model-control executors, its custom metric
families); this module owns only the way a call finds them. The server's Python backend makes its hooks
current (a ``ContextVar``) before model code runs: ``initialize``, ``execute`` (on the instance's thread
or, inline, in a hub greenlet) and ``finalize``, and the asyncio tasks of those calls, which copy the
context. Two servers in one process therefore never answer each other's models. After ``execute`` the
hooks stay set in that thread or greenlet (fast paths on; off, they are reset): only model code reads
them, and every call into model code makes its own server's current first (a read when they already
are, instead of a set and a reset per call).

A thread the model started itself does not carry the context (Python threads start with an empty one):
a call from there goes to the one server of the process that installed its hooks (:func:`install`: the
server at start, an isolated model's process at its start); with several installed the call is refused
(``TritonModelException``) rather than sent to whichever server came last. With none, the call sees
:data:`_UNSERVED` (no executors: "not supported by this server yet"; its own metric families), which is
what a model object used outside any server (a unit test) gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from typing import Any

from ....runtime.threads import native_lock
from .errors import TritonModelException


class MetricRegistry:
    """One server's custom metric families (``pb_utils.MetricFamily``) and the isolated model processes
    whose series it mirrors (``metrics_mirror.py``), read by that server's ``/metrics`` only."""

    def __init__(self) -> None:
        self.families: list[Any] = []  # MetricFamily, one per distinct name (models' threads append)
        self.processes: dict[int, Any] = {}  # id → a live isolated model process (metrics_mirror.Flushable)
        self.lock = native_lock()  # for ``processes`` (native threads register and leave)


class ServerHooks:
    """What one server gives its Python models: ``bls_executor(request, decoupled)``, optional
    ``bls_async_executor(request, decoupled)``, ``model_control`` (``load_model``, ``unload_model``,
    ``is_model_ready``) and ``metrics`` (its :class:`MetricRegistry`). Unset executors refuse the call."""

    __slots__ = ("bls_executor", "bls_async_executor", "model_control", "metrics")

    def __init__(self, bls_executor: Callable[..., Any] | None = None,
                 bls_async_executor: Callable[..., Any] | None = None, model_control: Any = None,
                 metrics: MetricRegistry | None = None) -> None:
        self.bls_executor = bls_executor
        self.bls_async_executor = bls_async_executor
        self.model_control = model_control
        self.metrics = metrics if metrics is not None else MetricRegistry()


_current: ContextVar[ServerHooks | None] = ContextVar("triton_python_backend_utils.server", default=None)
# process-wide: the servers (or the isolated model's process) running here, for threads without a context
_installed: list[ServerHooks] = []
_UNSERVED = ServerHooks()  # no server in this process
# True while a model's ``initialize`` or ``finalize`` runs (in that call's context only): Triton's stub
# refuses BLS then (``infer_request.cc``: "BLS is only supported during the 'execute' function.")
_outside_execute: ContextVar[bool] = ContextVar("triton_python_backend_utils.outside_execute", default=False)


def current() -> ServerHooks:
    """The hooks of the server whose model is calling (see the module doc); raises when ambiguous."""
    hooks = _current.get()
    if hooks is not None:
        return hooks
    installed = _installed
    if len(installed) == 1:
        return installed[0]
    if not installed:
        return _UNSERVED
    raise TritonModelException(
        f"{len(installed)} servers run in this process and this thread belongs to none of their models: "
        "call from the model's own thread (initialize, execute, finalize) or its asyncio tasks")


# the hooks set in this thread's or greenlet's context, None when none (no fallback to the installed ones):
# the backend reads it per call to see whether its thread already runs as its server
peek: Callable[[], ServerHooks | None] = _current.get


def enter(hooks: ServerHooks | None) -> Token[ServerHooks | None] | None:
    """Make ``hooks`` current in this thread or greenlet (None: leave the context alone)."""
    return None if hooks is None else _current.set(hooks)


def leave(token: Token[ServerHooks | None] | None) -> None:
    if token is not None:
        _current.reset(token)


@contextlib.contextmanager
def using(hooks: ServerHooks | None) -> Iterator[None]:
    """``with using(hooks):`` model code (or a call made for a model) runs as ``hooks``' server's."""
    token = enter(hooks)
    try:
        yield
    finally:
        leave(token)


@contextlib.contextmanager
def outside_execute() -> Iterator[None]:
    """``with outside_execute():`` the model's ``initialize`` / ``finalize`` runs: BLS is refused."""
    token = _outside_execute.set(True)
    try:
        yield
    finally:
        _outside_execute.reset(token)


def check_bls_allowed() -> None:
    """Raise Triton's error when BLS is called from ``initialize`` or ``finalize``."""
    if _outside_execute.get():
        raise TritonModelException("BLS is only supported during the 'execute' function.")


def install(hooks: ServerHooks) -> None:
    """A server starts (or an isolated model's process): it answers threads without a context when alone."""
    if hooks not in _installed:
        _installed.append(hooks)


def uninstall(hooks: ServerHooks) -> None:
    if hooks in _installed:
        _installed.remove(hooks)

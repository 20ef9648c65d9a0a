"""Process isolation for Python models: ``model.py`` runs in a child process of its own, so a segfault or
an ``os._exit`` in the model fails that model's requests and restarts it while the server serves on.

Opt-in (in-process stays the fast default): the model's config parameter ``TRITON_ACTOR_ISOLATION``
(``"process"`` or ``"thread"``) wins over the server's default, ``--backend-config=python,isolation=process``
(Triton's spelling for python backend settings; Triton itself isolates every Python model this way).

:class:`IsolatedInstance` is the server side of one instance: a :class:`~.base.BackendInstance` whose
methods run on the instance's native thread, as every backend's do. It sends the batch and reads the
answer itself (:mod:`.child_process`); meanwhile it serves the BLS and model-control calls the model
makes, on this same thread (so the BLS wait graph sees the instance waiting, as in-process). Calls
made while no command runs (a decoupled model's own threads) are served on a short-lived native
thread each. Every other frame to the process (credits, cancels, call answers, BLS streams, metric
flushes) goes through the process's one writer (``ChildProcess.to_child``, a ``SerialWriter``), in the
order it was submitted: the hub submits and goes on, the writer's thread waits for the pipe. Decoupled
responses go from the process's reader thread straight into the requests'
channels, never waiting there: each request's stream bound (1024 responses or 4 MiB not taken by its
client, ``runtime/response_channel.py``) is kept in the child by credits (``runtime/stream_credits.py``):
the model's ``send()`` waits there, on the model's thread, and the hub grants credit back as the client
takes responses (``("credit", key, responses, bytes)``). The requests of one gRPC
stream share its bound (``StreamAccount``), so they share one window in the child, keyed by an account id
sent with ``execute``, and get credit back per account (``("stream_credit", account, responses, bytes)``)
as the client takes a response of any of them, or their channels drop responses unread when they close.
The reader thread never waits for a client that does not read, so one slow client cannot hold up the
other requests of the process, its logs or its call answers. A reply is handled only after what the
model sent before it. A request's cancellation
(``request.is_cancelled()``) reaches the process as a frame (``bridge.CancelWatch``: nothing polls);
its custom metrics come back with each reply and when a scrape asks (``metrics_mirror.py``).

Crash handling (the Triton python backend's stub restart, bounded): when the process dies, the batch
in flight fails INTERNAL ("... the model's process exited with signal 11 (SIGSEGV)"), and so does
every decoupled request still open; a fresh process starts at once (:meth:`IsolatedInstance.revive`,
asked by actors/scheduling/instance.py, which reads :attr:`IsolatedInstance.health` after a failed batch and keeps
the instance out of its scheduler's pool meanwhile) and runs ``initialize`` again; a process killed
while idle is restarted by the next batch. After :data:`MAX_RESTARTS` failed starts in a row (waiting
:data:`RESTART_BACKOFF_S`, doubled each time, between them) the instance stops trying: it is DOWN (out
of the pool; the version is not ready once no instance is left) and fails any batch UNAVAILABLE until
the model is loaded again. A process that dies in its first ``initialize`` fails the load (the version is
UNAVAILABLE with that reason), as any load error does.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import TritonError
from ...inference import InferRequest
from ...repository.config import ModelConfig
from ...runtime.bridge import CancelWatch
from ...runtime.threads import native_sleep
from ..base import InstanceContext, Result
from . import isolation_wire as wire
from .isolated_session import _Exited, _Session

log = logging.getLogger(__name__)
_root = logging.getLogger()
PARAMETER = "TRITON_ACTOR_ISOLATION"
BACKEND_CONFIG_KEY = "isolation"
MODES = ("thread", "process")
MAX_RESTARTS = 3
RESTART_BACKOFF_S = 0.5
FINALIZE_GRACE_S = 30.0
STOP_GRACE_S = 5.0


def isolation_mode(parameters: Any, backend_config: dict[str, str]) -> str:
    """``"process"`` or ``"thread"``: the model's parameter, else the server's default, else thread."""
    param = parameters.get(PARAMETER)
    value = param.string_value if param is not None else backend_config.get(BACKEND_CONFIG_KEY, "thread")
    mode = value.strip().lower()
    if mode not in MODES:
        where = f"parameter {PARAMETER}" if param is not None else f"--backend-config=python,{BACKEND_CONFIG_KEY}"
        raise TritonError.invalid_arg(f"{where}: expected 'thread' or 'process', got '{value}'")
    return mode


def auto_complete(config: ModelConfig, version_dir: Path, filename: str) -> None:
    """``auto_complete_config`` of an isolated model, in a process of its own (a native helper
    thread waits); the completed config replaces ``config``'s contents."""
    session = _Session(f"{config.name}:auto_complete")
    try:
        completed = session.ask(("auto_complete", config.SerializeToString(), str(version_dir), filename))
    except _Exited as e:
        raise TritonError.internal(f"model '{config.name}': auto_complete_config: {e}") from None
    finally:
        session.child.stop(STOP_GRACE_S)
    config.ParseFromString(completed)


class IsolatedInstance:
    """One model instance whose ``model.py`` runs in a process of its own (instance's native thread)."""

    inline_ok = False  # every batch crosses to another process: never run it on the hub

    def __init__(self, ctx: InstanceContext) -> None:
        self.ctx = ctx
        self.decoupled = ctx.config.model_transaction_policy.decoupled
        # request.is_cancelled() in the child: a decoupled request's channel says it (see _deliver); any
        # other request's cancellation is told by the hub (scheduler.with_cancellation gives a CancelWatch)
        self.observes_cancellation = self.watches_cancellation = not self.decoupled
        self._failed_starts = 0
        self._gave_up: TritonError | None = None
        self._session: _Session | None = None
        self._session = self._start()  # a failure here fails the load

    def _start(self) -> _Session:
        ctx = self.ctx
        session = _Session(ctx.instance_name, ctx.server_hooks)
        init = (ctx.model_name, ctx.version, str(ctx.model_dir), str(ctx.version_dir),
                ctx.config.SerializeToString(), ctx.config_json, ctx.instance_name, ctx.kind, ctx.device_id,
                ctx.index, dict(ctx.backend_config), ctx.public_paths)
        try:
            session.ask(("init", init))
        except _Exited as e:
            session.child.stop(STOP_GRACE_S)
            raise TritonError.internal(f"failed to load model '{ctx.model_name}': {e} during initialize") from None
        except BaseException:
            session.child.stop(STOP_GRACE_S)
            raise
        log.info("instance %s runs in its own process (pid %d)", ctx.instance_name, session.child.pid)
        return session

    def _live_session(self) -> _Session | TritonError:
        """The running process, restarted if it died (bounded, with backoff)."""
        session = self._session
        if session is not None and session.alive:
            return session
        if self._gave_up is not None:
            return self._gave_up
        if session is not None:
            session.child.stop(STOP_GRACE_S)  # reaped already: this closes what is left of it
        self._session = None
        while True:
            if self._failed_starts:
                native_sleep(RESTART_BACKOFF_S * 2 ** (self._failed_starts - 1))
            try:
                self._session = self._start()
                self._failed_starts = 0
                return self._session
            except TritonError as e:
                self._failed_starts += 1
                log.error("instance %s: restarting its process failed (%d of %d): %s", self.ctx.instance_name,
                          self._failed_starts, MAX_RESTARTS, e.message)
                if self._failed_starts >= MAX_RESTARTS:
                    self._gave_up = TritonError.unavailable(
                        f"model '{self.ctx.model_name}' instance '{self.ctx.instance_name}': its process could not "
                        f"be restarted ({MAX_RESTARTS} attempts, the last: {e.message}); load the model again")
                    return self._gave_up

    @property
    def health(self) -> tuple[str, str]:
        """``("up", "")``; ``("restart", why)``: its process died, :meth:`revive` starts a new one;
        ``("down", why)``: it gave up. Read by the hub after a failed batch (plain reads of this
        thread's state: a hint, which :meth:`revive` settles on this thread)."""
        if self._gave_up is not None:
            return "down", self._gave_up.message
        session = self._session
        if session is None or session.alive:
            return "up", ""
        return "restart", f"instance '{self.ctx.instance_name}': {session.child.exit_text}"

    def revive(self) -> None:
        """Instance's thread: start a new process now if it died (bounded, as for a batch)."""
        self._live_session()

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        session = self._live_session()
        if isinstance(session, TritonError):
            return [session] * len(requests)
        if self.decoupled and any(r.responses is None for r in requests):
            return [TritonError.unsupported(
                f"model '{self.ctx.model_name}' is decoupled: it answers only streaming requests")] * len(requests)
        windows: dict[int, tuple[int, int | None, int | None, float | None] | None] = {}
        if self.decoupled:
            streams = [session.key_for(r.responses) for r in requests]
            keys: list[int | None] = [key for key, _window in streams]
            windows = dict(streams)
            watches: list[CancelWatch] = []
        else:
            keys, watches = self._watch_cancellation(session, requests)
        # traced requests (OpenTelemetry): a token each, that the model's BLS calls bring back while it runs
        # (a decoupled request's: until its final answer, see _Session.forget)
        traces = [None if r.trace is None else session.hold_trace(r.trace, k if self.decoupled else None)
                  for r, k in zip(requests, keys, strict=True)]
        try:
            answers = session.ask(("execute", [wire.request_to_wire(r, k, t) for r, k, t in zip(requests, keys, traces, strict=True)],
                                   _root.level, windows))  # the log settings may have changed: the child's follow
        except _Exited as e:
            return [TritonError.internal(
                f"Failed to process the request(s) for model '{self.ctx.instance_name}', message: {e} while "
                "it ran them; the next requests start a new one")] * len(requests)
        finally:
            for watch in watches:
                watch.callback = None
            if not self.decoupled:
                session.drop_traces(traces)
        if len(answers) != len(requests):  # PythonInstance always answers each: a bug of ours
            raise TritonError.internal(f"the model's process returned {len(answers)} results for {len(requests)} requests")
        results = [wire.result_from_wire(a) for a in answers]
        for key, result in zip(keys, results, strict=True):
            if key is not None and isinstance(result, TritonError):
                session.forget(key)  # the scheduler ends the request with this error
        return results

    @staticmethod
    def _watch_cancellation(session: _Session, requests: list[InferRequest]) -> tuple[list[int | None], list[CancelWatch]]:
        """Keys for the requests whose cancellation the child must hear of (``("cancel", key)``, sent by the
        hub when the client cancels; one already cancelled is told at once: the child keeps a cancel that
        overtakes its request). Nothing is polled."""
        keys: list[int | None] = []
        watches = []
        for request in requests:
            watch = request.is_cancelled
            if not isinstance(watch, CancelWatch):
                keys.append(None)
                continue
            key = session.new_key()
            watch.callback = partial(session.tell_cancel, key)
            if watch():
                session.tell_cancel(key)
            keys.append(key)
            watches.append(watch)
        return keys, watches

    def finalize(self) -> None:
        """Run ``finalize()`` in the process, then stop it (SIGTERM, SIGKILL after a grace period)."""
        session, self._session = self._session, None
        if session is None:
            return
        try:
            if session.alive:
                session.ask(("finalize",), timeout=FINALIZE_GRACE_S)
        except (_Exited, TritonError) as e:
            log.error("instance %s: finalize failed: %s", self.ctx.instance_name, e)
        finally:
            session.child.stop(STOP_GRACE_S)

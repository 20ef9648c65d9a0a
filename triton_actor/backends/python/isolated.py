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

import itertools
import logging
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import TritonError
from ...inference import InferRequest
from ...repository.config import ModelConfig
from ...runtime.bridge import CancelWatch
from ...runtime.stream_credits import CreditReturn, Window
from ...runtime.threads import native_lock, native_sleep, start_native_thread
from ..base import InstanceContext, Result
from . import isolation_wire as wire
from . import metrics_mirror
from .bls_relay import BlsRelay
from .child_process import ChildProcess
from .metrics_mirror import MetricsMirror
from .triton_python_backend_utils import server_calls as hooks
from .triton_python_backend_utils import serving
from .triton_python_backend_utils.serving import MetricRegistry, ServerHooks

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


class _Exited(Exception):
    """The model's process died while a command ran; ``str()`` says how."""


class _Session:
    """One model process and what is in flight with it. The instance's thread sends commands and reads
    their replies (serving the model's calls meanwhile); the reader thread (``on_message``,
    ``on_exit``) feeds the decoupled requests' channels and the log; the hub tells cancels and grants
    credit. Frames to the process go through ``child.to_child`` (:meth:`send`), whoever sends them."""

    def __init__(self, name: str, server: ServerHooks | None = None) -> None:
        self.server = server  # whose model this is: its calls and its metric registry
        # the registry its custom metrics are scraped from (no server: an auto_complete's, nobody scrapes it)
        self._registry = server.metrics if server is not None else MetricRegistry()
        self._lock = native_lock()  # channels: registered by the instance's thread, used by the reader's
        self._channels: dict[int, Any] = {}
        self._keys: dict[Any, int] = {}
        self._cancel_told: set[int] = set()
        self._relays: dict[int, BlsRelay] = {}  # decoupled BLS streams of the model, by call id (bls_relay.py)
        self._next_key = itertools.count(1)
        # a stream's account → its id in the child and what its client took (weak: a stream's, no longer)
        self._accounts: weakref.WeakKeyDictionary[Any, tuple[int, CreditReturn]] = weakref.WeakKeyDictionary()
        self._next_account = itertools.count(1)
        self.metrics = MetricsMirror(server)
        self._flushes: dict[int, Callable[[], None]] = {}  # token → a scrape's done(), until the answer came
        self._flush_ids = itertools.count(1)
        try:
            self.child = ChildProcess(name, self.on_message, self.on_exit)
        except OSError as e:
            raise TritonError.internal(f"could not start the model's process for '{name}': {e}") from None
        metrics_mirror.register(self, self._registry)

    @property
    def alive(self) -> bool:
        return self.child.exit_text is None

    def send(self, message: tuple[Any, ...]) -> None:
        """Any thread, never waits: ``message`` goes to the process after every frame sent before it
        (dropped when the process is gone: nothing there waits for it any more)."""
        try:
            self.child.to_child.submit(message)
        except OSError:
            pass

    # -- the instance's thread --------------------------------------------------------------------
    def ask(self, message: tuple[Any, ...], timeout: float | None = None) -> Any:
        """Send a command, serve the model's calls until its reply comes; the reply's value.
        Raises the model's TritonError, or :class:`_Exited` when the process died meanwhile."""
        child = self.child
        try:
            child.commands.send(message)
        except OSError:
            pass  # it is gone: its replies pipe has ended too
        while True:
            try:
                item = child.replies.next_message(timeout)
            except TimeoutError:
                raise _Exited(f"the model's process did not answer '{message[0]}' within {timeout:.0f} s") from None
            if item is None:
                raise _Exited(child.wait_exit_text())
            if item[0] == "call":  # made while this command runs: served here, on the instance's thread
                serve_call(self, *item[1:])
                continue
            _reply, answer, sent_before, metric_updates = item
            if metric_updates:  # the model's custom metrics as they were when it answered
                self.metrics.apply(metric_updates)
            child.wait_delivered(sent_before)  # what the model sent before answering is handled first
            if answer[0] == "error":
                raise wire.result_from_wire(answer)
            return answer[1]

    def new_key(self) -> int:
        return next(self._next_key)

    def key_for(self, channel: Any) -> tuple[int, tuple[int, int | None, int | None] | None]:
        """The key of a decoupled request's channel, and its window as ``execute`` sends it (``(responses,
        bytes, account)``, the account's id None for a window of its own; None: no bound). Its client's
        going away is told to the child at once, and so is what its client takes (see :meth:`_taken`)."""
        window = channel.window
        with self._lock:
            key = self._keys.get(channel)
            account = None if window is None else self._account_of(channel.account)
            if key is None:
                key = next(self._next_key)
                self._keys[channel], self._channels[key] = key, channel
                channel.on_cancel = partial(self._cancel_once, key)
                if account is not None:  # shared: granted back per account, also what its channel drops
                    channel.on_taken = partial(self._taken, ("stream_credit", account[0]), account[1])
                    channel.on_closed = partial(self._released, key, account[0], account[1])
                elif window is not None:
                    channel.on_taken = partial(self._taken, ("credit", key), CreditReturn(window))
        if channel.is_cancelled():  # gone before it was armed
            self._cancel_once(key)
        return key, None if window is None else (*window, None if account is None else account[0])

    def _account_of(self, account: Any) -> tuple[int, CreditReturn] | None:
        """Under the lock: a stream account's id in the child and its grants (None: no account)."""
        if account is None:
            return None
        found = self._accounts.get(account)
        if found is None:
            found = self._accounts[account] = (next(self._next_account),
                                               CreditReturn(Window(account.max_count, account.max_bytes)))
        return found

    def _taken(self, target: tuple[str, int], credits: CreditReturn, size: int, final: bool) -> None:
        """The hub (the greenlet that takes the request's responses): the client took one; once half its
        window was taken (the request's, or its stream's, shared), the child is told, which lets a send
        waiting for credit there go on."""
        grant = None if final else credits.taken(size)
        if grant is not None:
            self.send((*target, *grant))

    def _released(self, key: int, account: int, credits: CreditReturn, responses: int, size: int) -> None:
        """The hub: a channel of a stream's account closed, dropping what its client never took; that
        and what was taken but not yet told goes back at once (a shared window must get back all it
        was charged, or it shrinks for the stream's other requests). A cancelled request's cancel goes
        before the credit: the credit must not let its waiting send go on before the child knows."""
        grant = credits.release(responses, size)
        if grant is None:
            return
        with self._lock:
            channel = self._channels.get(key)
        if channel is not None and channel.is_cancelled():
            self._cancel_once(key)  # sent already, normally (on_cancel): then this sends nothing
        self.send(("stream_credit", account, *grant))

    def _cancel_once(self, key: int) -> None:
        """Any thread: tell the child once that the request ``key`` names was cancelled. Sent under the
        lock, so that whoever finds it told knows its frame is queued ahead of what they send next."""
        with self._lock:
            if key in self._cancel_told or key not in self._channels:
                return
            self._cancel_told.add(key)
            self.tell_cancel(key)

    def forget(self, key: int) -> None:
        with self._lock:
            channel = self._channels.pop(key, None)
            self._keys.pop(channel, None)
            self._cancel_told.discard(key)
        if channel is not None:
            channel.on_cancel = None
            if channel.window is not None and channel.account is None:  # a stream's: grants go on (_released)
                channel.on_taken = None

    # -- reader thread ----------------------------------------------------------------------------
    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "response":
            self._deliver(*message[1:])
        elif kind == "waiting":  # a send of the model waits for credit (or no more): what /status.json says
            with self._lock:
                channel = self._channels.get(message[1])
            if channel is not None and channel.window is not None:
                channel.remote_waiting = message[2]
        elif kind == "log":
            _log_record(message[1])
        elif kind == "call":  # made while no command runs (a decoupled model's own thread)
            start_native_thread(serve_call, self, *message[1:])
        elif kind in ("call_taken", "call_cancel"):  # what the model took of a decoupled BLS stream, or its cancel
            with self._lock:
                relay = self._relays.get(message[1])
            if relay is None:
                pass  # it ended meanwhile
            elif kind == "call_taken":
                relay.took(message[2], message[3])
            else:
                relay.cancel()
        elif kind == "metrics":  # the answer to a flush_metrics
            _kind, token, updates = message
            if updates:
                self.metrics.apply(updates)
            self._flush_done(token)
        else:
            log.error("model process %s: unexpected frame %r", self.child.name, kind)

    def _deliver(self, key: int, item: Any, final: bool, size: int, account: int | None) -> None:
        """Never waits: the child keeps the stream's bound (it spent ``size`` of the request's credit, or of
        its stream's ``account``), so a client that does not read stalls only its own request (or
        stream), not this thread and every other request, log and call answer of the process behind it.
        A response of an account that nobody will take (its channel closed) is granted back at once."""
        with self._lock:
            channel = self._channels.get(key)
        queued = channel is not None and channel.put(wire.result_from_wire(item), final, size)
        if not queued and not final and account is not None:
            self._refund(account, size)
        if channel is None:
            return
        if final:
            self.forget(key)
        elif channel.is_cancelled():  # (told already by on_cancel, normally)
            self._cancel_once(key)

    def _refund(self, account: int, size: int) -> None:
        """Reader thread: a response charged to ``account`` arrived after its channel closed: granted back."""
        self.send(("stream_credit", account, 1, size))

    def tell_cancel(self, key: int) -> None:
        """Any thread: the request ``key`` names was cancelled (its ``is_cancelled()`` turns true)."""
        self.send(("cancel", key))

    def request_flush(self, done: Callable[[], None]) -> None:
        """Any thread, never waits (a scrape, on the hub): ask for the model's unsent metric updates;
        ``done()`` once they are applied, or the process is gone (on the reader's thread, or here)."""
        token = next(self._flush_ids)
        with self._lock:
            self._flushes[token] = done
        try:
            self.child.to_child.submit(("flush_metrics", token))
        except OSError:  # closed: on_exit, which answers every flush, ran or runs after this token was added
            self._flush_done(token)

    def _flush_done(self, token: int | None) -> None:
        with self._lock:
            dones = list(self._flushes.values()) if token is None else [self._flushes.get(token)]
            if token is None:
                self._flushes.clear()
            else:
                self._flushes.pop(token, None)
        for done in dones:
            if done is not None:
                done()

    def relay(self, call_id: int, responses: Any) -> None:
        """The thread serving the model's decoupled BLS call: forward ``responses`` (the server's iterator)
        to the process on a native thread of its own (:mod:`.bls_relay`), so that the thread serving
        calls goes on (the model may make other calls while it reads the stream)."""
        relay = BlsRelay(self.child.to_child.submit, call_id, responses, self._relay_done)
        with self._lock:
            gone = self.child.exit_text is not None
            if not gone:
                self._relays[call_id] = relay
        if gone:
            relay.cancel()  # on_exit ran already: nothing would cancel it later
        start_native_thread(relay.run)

    def _relay_done(self, call_id: int) -> None:
        with self._lock:
            self._relays.pop(call_id, None)

    def on_exit(self, text: str) -> None:
        metrics_mirror.unregister(self, self._registry)
        self._flush_done(None)  # every flush it owed: it has nothing more to say
        with self._lock:
            open_channels = list(self._channels.values())
            self._channels.clear()
            self._keys.clear()
            relays = list(self._relays.values())
            self._relays.clear()
        for relay in relays:  # nobody reads them any more: their targets are cancelled
            relay.cancel()
        for channel in open_channels:
            channel.send(TritonError.internal(f"{text} before the request was finished"), True)


def _log_record(fields: dict[str, Any]) -> None:
    """Reader thread: a record the model's process logged, through the server's handlers."""
    logger = logging.getLogger(fields["name"])
    if logger.isEnabledFor(fields["levelno"]):
        logger.handle(logging.makeLogRecord(fields))


def serve_call(session: _Session, call_id: int, op: str, args: tuple[Any, ...]) -> None:
    """A call the model made (BLS, model control, a new custom metric), run with the server's own hooks
    on this native thread; the answer goes back as ``call_reply``. A decoupled BLS call's iterator is
    made here (on the instance's thread the BLS wait graph sees the instance waiting; this thread runs
    no model code, so the iterator's inbox is a plain queue that the relay's thread may read) and its
    responses go on a relay's thread (:mod:`.bls_relay`): ``call_stream``, ``call_item``s, ``call_end``."""
    try:
        with serving.using(session.server):
            answer = _call(session, call_id, op, args)
        if answer is None:
            return  # a decoupled BLS stream: its relay answers
    except OSError:
        return  # the model's process is gone
    except Exception as e:  # noqa: BLE001 - the model sees it raised, as in-process
        answer = ("raise", str(e))
    session.send(("call_reply", call_id, answer))


def _call(session: _Session, call_id: int, op: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``serve_call``'s work, as the session's server: the answer (None when a relay answers)."""
    if op == "bls":
        request, decoupled = args
        result = hooks.bls_exec(wire.pb_request_from_wire(request), decoupled)
        if decoupled:
            session.relay(call_id, result)
            return None
        return ("ok", wire.pb_response_to_wire(result))
    if op in ("load_model", "unload_model", "is_model_ready"):
        return ("ok", getattr(hooks, op)(*args))
    if op == "metric_family":
        return ("ok", session.metrics.family(*args))
    if op == "metric_series":
        return ("ok", session.metrics.series(*args))
    return ("raise", f"unknown call '{op}'")


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
                ctx.index, dict(ctx.backend_config))
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
        windows: dict[int, tuple[int, int | None, int | None] | None] = {}
        if self.decoupled:
            streams = [session.key_for(r.responses) for r in requests]
            keys: list[int | None] = [key for key, _window in streams]
            windows = dict(streams)
            watches: list[CancelWatch] = []
        else:
            keys, watches = self._watch_cancellation(session, requests)
        try:
            answers = session.ask(("execute", [wire.request_to_wire(r, k) for r, k in zip(requests, keys, strict=True)],
                                   _root.level, windows))  # the log settings may have changed: the child's follow
        except _Exited as e:
            return [TritonError.internal(
                f"Failed to process the request(s) for model '{self.ctx.instance_name}', message: {e} while "
                "it ran them; the next requests start a new one")] * len(requests)
        finally:
            for watch in watches:
                watch.callback = None
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

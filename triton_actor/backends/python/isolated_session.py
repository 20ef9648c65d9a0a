"""The server's side of one model process while it runs: :class:`_Session` (what is in flight with the
process: the commands' replies, the decoupled requests' channels and their credit, the cancels, the
metric flushes, the BLS relays) and :func:`serve_call`, which runs a call the model made (BLS, model
control, a custom metric) with the server's own hooks. :mod:`.isolated` starts and restarts sessions.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from ...errors import TritonError
from ...runtime.stream_credits import CreditReturn, Window
from ...runtime.threads import native_lock, start_native_thread
from . import isolation_wire as wire
from . import metrics_mirror
from .bls_relay import BlsRelay
from .child_process import ChildProcess
from .metrics_mirror import MetricsMirror
from .triton_python_backend_utils import server_calls as hooks
from .triton_python_backend_utils import serving
from .triton_python_backend_utils.serving import MetricRegistry, ServerHooks

log = logging.getLogger(__name__)
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
        # token → the trace (OpenTelemetry) of a request the process runs now, for the BLS calls it makes:
        # held by the instance's thread from execute until its answer, read by the call threads
        self._traces: dict[int, Any] = {}
        self._trace_keys: dict[int, int] = {}  # a decoupled request's key → its trace's token, until forget
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

    def hold_trace(self, trace: Any, key: int | None = None) -> int:
        """A token for ``trace`` while its request runs in the process (:meth:`drop_traces` ends it); a
        decoupled request's (its channel's ``key``) until its final answer (:meth:`forget`)."""
        token = next(self._next_key)
        with self._lock:
            self._traces[token] = trace
            if key is not None:
                self._trace_keys[key] = token
        return token

    def trace_of(self, token: int) -> Any:
        """The trace a BLS request's token stands for; None once its request was answered (or a token
        the process made up: it is a number it was given, never more)."""
        with self._lock:
            return self._traces.get(token)

    def drop_traces(self, tokens: list[int | None]) -> None:
        with self._lock:
            for token in tokens:
                if token is not None:
                    self._traces.pop(token, None)

    def key_for(self, channel: Any) -> tuple[int, tuple[int, int | None, int | None, float | None] | None]:
        """The key of a decoupled request's channel, and its window as ``execute`` sends it (``(responses,
        bytes, account, look)``, the account's id None for a window of its own, ``look`` how often a send
        waiting for credit says it still waits, None: never; None: no bound). Its client's
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
        return key, None if window is None else (*window, None if account is None else account[0], channel.stall_look)

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
            self._traces.pop(self._trace_keys.pop(key, 0), None)
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
                channel.remote_wait(message[2])
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
            self._traces.clear()
            self._trace_keys.clear()
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
        result = hooks.bls_exec(wire.pb_request_from_wire(request, session.trace_of), decoupled)
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

"""The process an isolated Python model runs in: ``python -m triton_actor.backends.python.isolated_child
COMMANDS_FD INBOX_FD REPLIES_FD OUTBOX_FD LOG_LEVEL``, started by :mod:`.child_process`.

It is a plain Python process (no gevent, no server): it imports ``model.py`` with the rules of the
in-process backend and runs the very same :class:`~.backend.PythonInstance`, so the ``args`` of
``initialize``, the requests ``execute`` sees and the texts of the errors are those of a model run
in-process. The frames on its four pipes are listed in ``docs/isolation.md`` (section "Frames");
:mod:`.isolation_wire` encodes their values.

Threads: the main thread runs the commands one at a time; the reader thread routes call answers to
their waiters, cancellations and credits to their requests (a cancel that overtakes its request, which
came on the other pipe, is kept for it) and answers flushes; the ``isolation-bls-cancels`` thread
(:mod:`.isolated_child_bls`) sends the cancels of BLS streams the model dropped. A decoupled request's
``send()`` waits for credit on the thread of the model that sends (the main thread, or one the model started), never on the
reader: the server's reader of this process never waits for a slow client, so one request's client
cannot stall the others'. The windows of streams' accounts (``SharedCredits``) are guarded by one lock,
``ModelProcess.shared_room``, taken by the model's sending threads and by the reader for a grant. Failure: what the model raises becomes an error
reply; at end of the commands (the server stopped it) the main thread returns; at end of the inbox
(the server stopped, or died) the process leaves within ``EOF_GRACE_S`` whatever the model is doing.
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import logging
import os
import queue
import sys
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import TritonError
from ...inference import response_bytes
from ...repository.config import ModelConfig
from ...runtime.stream_credits import SendCredit, SharedCredits, Window
from ...runtime.threads import start_native_thread
from ..base import InstanceContext
from . import isolation_wire as wire
from .backend import PythonBackend, PythonInstance, python_error_text
from .frame_pipe import FrameReader, FrameWriter
from .isolated_child_bls import BlsStreams
from .metrics_forwarding import MetricsForwarder
from .stub_argv import STUB_ARGV
from .triton_python_backend_utils import metrics as custom_metrics
from .triton_python_backend_utils import serving

EOF_GRACE_S = 10.0
_root = logging.getLogger()


class ChildChannel:
    """Stands in for a decoupled request's response channel: what the model sends goes to the server.

    ``send()`` runs on whichever thread of the model sends; it waits while the request holds its window
    of responses the client has not taken (``runtime/stream_credits.py``), or the requests of its
    stream's ``account`` hold theirs together, until the reader thread hears ``("credit", ...)``,
    ``("stream_credit", ...)`` or ``("cancel", ...)``. Once the request is cancelled, or finished, what
    the model sends is dropped (Triton's python backend drops a cancelled request's responses too);
    a final one after a cancel still goes, without outputs, so that the server forgets the request.
    The final response is never charged to the credit (it never waits, and is never granted back).
    """

    __slots__ = ("_process", "key", "account", "cancelled", "_finished", "_credit", "_room", "_look")

    def __init__(self, process: ModelProcess, key: int, window: Window | None, account: int | None = None,
                 look: float | None = None) -> None:
        self._process = process
        self.key = key
        self.account = account  # the stream's, whose window the request shares (None: one of its own)
        self._look = look  # a waiting send says it still waits every ``look`` s (None: once)
        self.cancelled = False  # set by the reader thread when the server says the client went away
        self._finished = False
        if account is None:  # the credit, the flags: model threads and the reader
            self._room = threading.Condition(threading.Lock())
            self._credit = SendCredit(window)
        else:  # the process's lock of the shared credits: a grant to the account wakes its requests' sends
            self._room = process.shared_room
            with self._room:
                self._credit = process.shared_credits.open(window, account)

    def send(self, item: Any, final: bool) -> None:
        size = response_bytes(item)
        with self._room:
            if self._finished:
                return
            if final:
                self._end()  # a send of another thread waiting for credit: dropped now
            elif not self._credit.may_send() and not self.cancelled:
                self._wait_for_credit()
                if self._finished:  # finish() while it waited
                    return
            if self.cancelled:
                if not final:
                    return
                item, size = None, 0
            if not final:
                self._credit.spend(size)
        if final:
            self._process.channels.pop(self.key, None)
        self._process.send(("response", self.key, wire.result_to_wire(item), final, size, self.account))

    def _end(self) -> None:
        """Under ``_room``: the request is over; waiting sends return, and a shared credit loses a user."""
        self._finished = True
        if self.account is not None:
            self._process.shared_credits.end(self.account)
        self._room.notify_all()

    def _wait_for_credit(self) -> None:
        """Under ``_room``: the server is told this request's sender waits (its ``/status.json``
        ``streams.waiting_senders``), then told it goes on, in order with the responses. Meanwhile it
        says again every ``look`` s that it still waits: the server, which knows what the client took,
        cancels the request once the client took nothing for its stall time (a ``("cancel", key)``)."""
        self._process.send(("waiting", self.key, True))
        while not self._credit.may_send() and not self.cancelled and not self._finished:
            if not self._room.wait(self._look):
                self._process.send(("waiting", self.key, True))
        self._process.send(("waiting", self.key, False))

    def is_cancelled(self) -> bool:
        return self.cancelled

    def cancel(self) -> None:
        """Reader thread: the client went away; a waiting send returns (dropped)."""
        with self._room:
            self.cancelled = True
            self._room.notify_all()

    def finish(self) -> None:
        """Main thread: ``execute`` failed, so the server ended the request with that error (as the final
        response, and forgot it): later sends are dropped, a waiting one returns."""
        with self._room:
            if not self._finished:
                self._end()
        self._process.channels.pop(self.key, None)

    def grant(self, responses: int, size: int) -> None:
        """Reader thread: the client took ``responses`` (``size`` bytes): waiting sends may go on."""
        with self._room:
            self._credit.refund(responses, size)
            self._room.notify_all()


class CancelFlag:
    """A non-decoupled request's ``is_cancelled()`` here: set by the reader thread on ``("cancel", key)``."""

    __slots__ = ("cancelled",)

    def __init__(self, cancelled: bool) -> None:
        self.cancelled = cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled

    def cancel(self) -> None:
        self.cancelled = True

    def grant(self, responses: int, size: int) -> None:
        """Never asked of a request that is not streamed."""


class ModelProcess:
    """The main loop of the model's process and the calls it makes to the server."""

    def __init__(self, commands: FrameReader, inbox: FrameReader, replies: FrameWriter, outbox: FrameWriter) -> None:
        self.commands = commands
        self.inbox = inbox
        self.replies = replies
        self.outbox = outbox
        self.waiters: dict[int, queue.SimpleQueue[Any]] = {}
        self.channels: dict[int, ChildChannel | CancelFlag] = {}  # by key: what a ("cancel", key) sets
        self.shared_credits = SharedCredits()  # the windows of streams' accounts (model threads, the reader)
        self.shared_room = threading.Condition(threading.Lock())  # guards them; notified on their grants
        self._keys = threading.Lock()  # channels, _early and _last_key: the main thread's and the reader's
        self._early: set[int] = set()  # cancels that overtook their request (another pipe): kept for it
        self._last_key = 0
        self.instance: PythonInstance | None = None
        self._ids = itertools.count(1)
        self.metrics = MetricsForwarder(self.call)
        self._phase = threading.Lock()  # a command starts or ends: calls switch between replies and outbox
        self._in_command = False
        self.bls_streams = BlsStreams(self.send, self.waiters)

    def send(self, message: Any) -> None:
        self.outbox.send(message)

    def send_call(self, message: Any) -> None:
        with self._phase:
            (self.replies if self._in_command else self.outbox).send(message)

    # -- reader thread ----------------------------------------------------------------------------
    def read(self) -> None:
        try:
            while (messages := self.inbox.read_available()) is not None:
                for message in messages:
                    self._route(message)
        except Exception:  # noqa: BLE001 - a broken pipe or frame: nothing more will come
            traceback.print_exc()
        time.sleep(EOF_GRACE_S)  # the main thread normally ends the process first (end of its commands)
        os._exit(1)

    def _route(self, message: Any) -> None:
        kind = message[0]
        if kind == "credit":
            target = self.channels.get(message[1])
            if target is not None:  # (a request finished meanwhile: nothing waits)
                target.grant(message[2], message[3])
            return
        if kind == "stream_credit":  # to every request of the account: each waiting send checks again
            with self.shared_room:
                if self.shared_credits.grant(*message[1:]) is not None:
                    self.shared_room.notify_all()
            return
        if kind == "cancel":
            key = message[1]
            with self._keys:
                target = self.channels.get(key)
                if target is None and key > self._last_key:
                    self._early.add(key)
            if target is not None:
                target.cancel()
            return
        if kind == "flush_metrics":  # a scrape: what the model changed since it was last sent
            self.send(("metrics", message[1], self.metrics.collect()))
            return
        if kind != "call_item" and not self.bls_streams.on_frame(kind, message[1]):
            return
        waiter = self.waiters.get(message[1])  # call_reply, call_stream, call_item, call_end
        if waiter is not None:
            waiter.put(message)

    # -- main thread ------------------------------------------------------------------------------
    def serve(self) -> None:
        while (message := self.commands.next_message()) is not None:
            with self._phase:
                self._in_command = True
            kind = message[0]
            try:
                value = getattr(self, f"_on_{kind}")(*message[1:])
                reply: tuple[Any, ...] = ("ok", value)
            except TritonError as e:
                reply = wire.error_to_wire(e)
            except Exception as e:  # noqa: BLE001 - a failure of ours, told to the server
                reply = wire.error_to_wire(TritonError.internal(f"{kind} failed: {python_error_text(e)}"))
            self._reply(reply)
            if kind == "finalize":
                return

    def _reply(self, reply: tuple[Any, ...]) -> None:
        with self._phase:
            updates = self.metrics.collect()  # the custom metrics as they are now: current when the client hears
            try:
                self.replies.send(("reply", reply, self.outbox.sent, updates))
            except OSError:
                raise  # the server is gone
            except Exception as e:  # noqa: BLE001 - e.g. an output holding objects that cannot be pickled
                self.replies.send(("reply", wire.error_to_wire(TritonError.internal(
                    f"model '{self._name()}': its answer could not be sent to the server: {e!r}")), self.outbox.sent,
                    updates))
            self._in_command = False

    def _name(self) -> str:
        return "" if self.instance is None else self.instance.ctx.model_name

    def _on_init(self, ctx: tuple[Any, ...]) -> bool:
        (name, version, model_dir, version_dir, config, config_json, instance, kind, device, index, backend_config,
         public_paths) = ctx
        parsed = ModelConfig()
        parsed.ParseFromString(config)
        self.instance = PythonInstance(InstanceContext(
            name, version, Path(model_dir), Path(version_dir), parsed, config_json, instance, kind, device, index,
            backend_config, None, tuple(public_paths)))
        return self.instance.decoupled

    def _on_execute(self, requests: list[tuple[Any, ...]], log_level: int,
                    windows: dict[int, tuple[int, int | None, int | None, float | None] | None]) -> list[Any]:
        instance = self.instance
        assert instance is not None
        if log_level != _root.level:  # changed at run time (/v2/logging): what the model logs follows
            _root.setLevel(log_level)
        if instance.decoupled:
            batch = [wire.request_from_wire(r, partial(self._channel, windows)) for r in requests]
            results = instance.execute(batch)
            for request, result in zip(batch, results, strict=True):
                if isinstance(result, TritonError):  # the server ends the request with it: what follows is dropped
                    request.responses.finish()
            return [wire.result_to_wire(r) for r in results]
        batch = [wire.request_from_wire(r, self._cancel_flag) for r in requests]
        try:
            return [wire.result_to_wire(r) for r in instance.execute(batch)]
        finally:
            with self._keys:
                for r in requests:
                    self.channels.pop(r[-1], None)  # its key (None: nobody can cancel it)

    def _channel(self, windows: dict[int, tuple[int, int | None, int | None, float | None] | None],
                 key: int) -> tuple[ChildChannel, None]:
        """A decoupled request's stand-in channel; ``windows[key]``: its stream's bound, account and how
        often a waiting send says it still waits (None: no bound)."""
        window = windows.get(key)
        with self._keys:
            self._last_key = max(self._last_key, key)
            channel = self.channels.get(key)
            if channel is None:
                channel = self.channels[key] = (ChildChannel(self, key, None) if window is None else
                                                ChildChannel(self, key, Window(*window[:2]), *window[2:]))
                channel.cancelled = key in self._early
                self._early.discard(key)
        return channel, None

    def _cancel_flag(self, key: int) -> tuple[None, Any]:
        with self._keys:
            self._last_key = max(self._last_key, key)
            flag = self.channels[key] = CancelFlag(key in self._early)
            self._early.discard(key)
        return None, flag.is_cancelled

    def _on_finalize(self) -> None:
        if self.instance is not None:
            self.instance.finalize()

    def _on_auto_complete(self, config: bytes, version_dir: str, filename: str) -> bytes:
        parsed = ModelConfig()
        parsed.ParseFromString(config)
        PythonBackend()._auto_complete(parsed, Path(version_dir), filename)
        return parsed.SerializeToString()

    # -- calls to the server (any thread of the model) --------------------------------------------
    def call(self, op: str, *args: Any) -> Any:
        call_id, waiter = self._open_call(op, args)
        try:
            return wire.call_answer(waiter.get())
        finally:
            self.waiters.pop(call_id, None)

    def _open_call(self, op: str, args: tuple[Any, ...]) -> tuple[int, queue.SimpleQueue[Any]]:
        call_id = next(self._ids)
        waiter: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiters[call_id] = waiter
        self.send_call(("call", call_id, op, args))
        return call_id, waiter

    def bls(self, request: Any, decoupled: bool) -> Any:
        """The ``bls_executor`` of this process's ``ServerHooks`` (``pb_utils.serving``)."""
        if not decoupled:
            return wire.pb_response_from_wire(self.call("bls", wire.pb_request_to_wire(request), False))
        call_id, waiter = self._open_call("bls", (wire.pb_request_to_wire(request), True))
        return self.bls_streams.open(call_id, waiter)


    def bls_async(self, request: Any, decoupled: bool) -> Any:
        """The ``bls_async_executor``: the call waits on a thread of its own, so the model's asyncio loop
        runs its other coroutines meanwhile (as in-process and in Triton's stub); decoupled, the future
        is done once the first response is in, as Triton's is."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def run() -> None:
            try:
                ok, value = True, self.bls(request, decoupled)
                if decoupled:
                    value = _Prefetched(value)
            except Exception as e:  # noqa: BLE001 - delivered through the future
                ok, value = False, e
            loop.call_soon_threadsafe(_settle, future, ok, value)

        start_native_thread(run)
        return future


def _settle(future: Any, ok: bool, value: Any) -> None:
    """The model's loop thread."""
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class _Prefetched:
    """A BLS stream whose first response was taken (on the call's thread): it yields it first."""

    def __init__(self, responses: Any) -> None:
        self._responses = responses
        self._first = [next(responses, _NOTHING)]

    def __iter__(self) -> _Prefetched:
        return self

    def __next__(self) -> Any:
        if self._first:
            first = self._first.pop()
            if first is not _NOTHING:
                return first
        return next(self._responses)

    def __getattr__(self, name: str) -> Any:  # cancel() and the rest: the stream's own
        return getattr(self._responses, name)


_NOTHING = object()


class _ModelControl:
    """``pb_utils.load_model`` & co. in this process: asked of the server."""

    def __init__(self, process: ModelProcess) -> None:
        self._process = process

    def load_model(self, name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
        self._process.call("load_model", name, config, files)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._process.call("unload_model", name, unload_dependents)

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._process.call("is_model_ready", name, version))


class _ForwardLogs(logging.Handler):
    """Every log record of this process, as a frame: the server logs it through its own handlers."""

    def __init__(self, process: ModelProcess) -> None:
        super().__init__()
        self._process = process

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: getattr(record, k) for k in ("name", "levelno", "levelname", "pathname", "filename",
                                                       "module", "lineno", "funcName", "created", "msecs",
                                                       "process", "processName", "threadName")}
            fields["msg"] = record.getMessage()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            fields["exc_text"] = record.exc_text
            self._process.send(("log", fields))
        except Exception:  # noqa: BLE001 - logging never raises into the model
            self.handleError(record)


def main(argv: list[str]) -> int:
    faulthandler.enable()  # a segfault's traceback goes to stderr, which the server logs
    commands, inbox, replies, outbox = (int(fd) for fd in argv[1:5])
    sys.argv = list(STUB_ARGV)  # what the model sees, as in Triton's stub process (stub_argv.py)
    process = ModelProcess(FrameReader(commands), FrameReader(inbox), FrameWriter(replies, threading.Lock()),
                           FrameWriter(outbox, threading.Lock()))  # the model's threads, the main and the reader send
    root = logging.getLogger()
    root.setLevel(int(argv[5]) if len(argv) > 5 else logging.INFO)
    root.addHandler(_ForwardLogs(process))
    # this process runs one model for one server: its hooks answer every thread of the model
    serving.install(serving.ServerHooks(bls_executor=process.bls, bls_async_executor=process.bls_async,
                                        model_control=_ModelControl(process)))
    custom_metrics._forward = process.metrics
    threading.Thread(target=process.read, name="isolation-reader", daemon=True).start()
    process.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

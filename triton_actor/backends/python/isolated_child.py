"""The process an isolated Python model runs in: ``python -m triton_actor.backends.python.isolated_child
READ_FD WRITE_FD LOG_LEVEL``, started by :mod:`.child_process`.

It is a plain Python process (no gevent, no server): it imports ``model.py`` with the rules of the
in-process backend and runs the very same :class:`~.backend.PythonInstance`, so the ``args`` of
``initialize``, the requests ``execute`` sees and the texts of the errors are those of a model run
in-process. Frames in (:mod:`.isolation_wire`): ``("init", ctx)``, ``("execute", requests)``,
``("finalize",)``, ``("auto_complete", config, version_dir, filename)``, each answered by one
``("reply", ("ok", value) | ("error", code, message))``; ``("cancel", key)``; and the answers to the
calls this process makes. Frames out, besides the replies: ``("response", key, result, final)`` for
a decoupled request, ``("log", record)`` for the stdlib logging (``pb_utils.Logger`` included), and
``("call", id, op, args)`` for BLS and model control, answered by ``("call_reply", id, answer)`` (a
streamed BLS by ``("call_item", id, response)`` ... ``("call_end", id)``).

Threads: the main thread runs the commands one at a time; a reader thread routes what arrives (call
answers to their waiters, cancellations to their channels, commands to the main thread). Failure:
what the model raises becomes an error reply; at end of input (the server stopped it, or died) the
process exits, at once if the main thread is idle, else after ``EOF_GRACE_S``.
"""

from __future__ import annotations

import faulthandler
import itertools
import logging
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ...errors import TritonError
from ...repository.config import ModelConfig
from ..base import InstanceContext
from . import isolation_wire as wire
from .backend import PythonBackend, PythonInstance, python_error_text
from .frame_pipe import FramePipe
from .triton_python_backend_utils import TritonModelException
from .triton_python_backend_utils import server_calls as hooks

EOF_GRACE_S = 10.0
_EOF = ("eof",)


class ChildChannel:
    """Stands in for a decoupled request's response channel: what the model sends goes to the server."""

    __slots__ = ("_process", "key", "cancelled")

    def __init__(self, process: ModelProcess, key: int) -> None:
        self._process = process
        self.key = key
        self.cancelled = False  # set by the reader thread when the server says the client went away

    def send(self, item: Any, final: bool) -> None:
        if final:
            self._process.channels.pop(self.key, None)
        self._process.send(("response", self.key, wire.result_to_wire(item), final))

    def is_cancelled(self) -> bool:
        return self.cancelled


class ModelProcess:
    """The main loop of the model's process and the calls it makes to the server."""

    def __init__(self, pipe: FramePipe) -> None:
        self.pipe = pipe
        self.commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiters: dict[int, queue.SimpleQueue[Any]] = {}
        self.channels: dict[int, ChildChannel] = {}
        self.instance: PythonInstance | None = None
        self._ids = itertools.count(1)
        self._idle = True

    def send(self, message: Any) -> None:
        self.pipe.send(message)

    # -- reader thread ----------------------------------------------------------------------------
    def read(self) -> None:
        try:
            while (messages := self.pipe.read_available()) is not None:
                for message in messages:
                    self._route(message)
        except Exception:  # noqa: BLE001 - a broken pipe or frame: nothing more will come
            traceback.print_exc()
        self.commands.put(_EOF)
        if not self._idle:
            time.sleep(EOF_GRACE_S)  # the model is still running: give it a moment, then leave anyway
        os._exit(0)

    def _route(self, message: Any) -> None:
        kind = message[0]
        if kind in ("call_reply", "call_item", "call_end"):
            waiter = self.waiters.get(message[1])
            if waiter is not None:
                waiter.put(message)
        elif kind == "cancel":
            channel = self.channels.get(message[1])
            if channel is not None:
                channel.cancelled = True
        else:
            self.commands.put(message)

    # -- main thread ------------------------------------------------------------------------------
    def serve(self) -> None:
        while (message := self.commands.get()) is not _EOF:
            self._idle = False
            kind = message[0]
            try:
                value = getattr(self, f"_on_{kind}")(*message[1:])
                reply: tuple[Any, ...] = ("ok", value)
            except TritonError as e:
                reply = wire.error_to_wire(e)
            except Exception as e:  # noqa: BLE001 - a failure of ours, told to the server
                reply = wire.error_to_wire(TritonError.internal(f"{kind} failed: {python_error_text(e)}"))
            try:
                self.send(("reply", reply))
            except Exception as e:  # noqa: BLE001 - e.g. an output that cannot be pickled
                self.send(("reply", wire.error_to_wire(TritonError.internal(
                    f"model '{self._name()}': its answer could not be sent to the server: {e!r}"))))
            self._idle = True
            if kind == "finalize":
                return

    def _name(self) -> str:
        return "" if self.instance is None else self.instance.ctx.model_name

    def _on_init(self, ctx: tuple[Any, ...]) -> bool:
        name, version, model_dir, version_dir, config, config_json, instance, kind, device, index, backend_config = ctx
        parsed = ModelConfig()
        parsed.ParseFromString(config)
        self.instance = PythonInstance(InstanceContext(
            name, version, Path(model_dir), Path(version_dir), parsed, config_json, instance, kind, device, index,
            backend_config))
        return self.instance.decoupled

    def _on_execute(self, requests: list[tuple[Any, ...]]) -> list[Any]:
        assert self.instance is not None
        batch = [wire.request_from_wire(r, self._channel) for r in requests]
        return [wire.result_to_wire(r) for r in self.instance.execute(batch)]

    def _channel(self, key: int) -> ChildChannel:
        channel = self.channels.get(key)
        if channel is None:
            channel = self.channels[key] = ChildChannel(self, key)
        return channel

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
            return _answer(waiter.get())
        finally:
            self.waiters.pop(call_id, None)

    def _open_call(self, op: str, args: tuple[Any, ...]) -> tuple[int, queue.SimpleQueue[Any]]:
        call_id = next(self._ids)
        waiter: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiters[call_id] = waiter
        self.send(("call", call_id, op, args))
        return call_id, waiter

    def bls(self, request: Any, decoupled: bool) -> Any:
        """``pb_utils.server_calls.bls_executor`` in this process."""
        if not decoupled:
            return wire.pb_response_from_wire(self.call("bls", wire.pb_request_to_wire(request), False))
        call_id, waiter = self._open_call("bls", (wire.pb_request_to_wire(request), True))
        return StreamedResponses(self, call_id, waiter)


def _answer(message: Any) -> Any:
    """The value of a ``call_reply``; a refusal is raised as the model would see it in-process."""
    answer = message[2]
    if answer[0] == "raise":
        raise TritonModelException(answer[1])
    return answer[1]


class StreamedResponses:
    """What ``exec(decoupled=True)`` returns here: the target's responses as the server forwards them.
    ``cancel()`` stops yielding (the target is not told: a limit of isolation)."""

    def __init__(self, process: ModelProcess, call_id: int, waiter: queue.SimpleQueue[Any]) -> None:
        self._process = process
        self._id = call_id
        self._waiter = waiter
        self._done = False

    def __iter__(self) -> StreamedResponses:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        message = self._waiter.get()
        if message[0] == "call_item":
            return wire.pb_response_from_wire(message[2])
        self.cancel()
        if message[0] == "call_reply":
            _answer(message)
        raise StopIteration

    def cancel(self) -> None:
        self._done = True
        self._process.waiters.pop(self._id, None)


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
    pipe = FramePipe(int(argv[1]), int(argv[2]))
    process = ModelProcess(pipe)
    root = logging.getLogger()
    root.setLevel(int(argv[3]) if len(argv) > 3 else logging.INFO)
    root.addHandler(_ForwardLogs(process))
    hooks.bls_executor = process.bls
    hooks.model_control = _ModelControl(process)
    threading.Thread(target=process.read, name="isolation-reader", daemon=True).start()
    process.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

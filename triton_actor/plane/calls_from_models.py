"""What Python models ask of the server (Triton's BLS and model control), served through the data plane.

``pb_utils.InferenceRequest.exec()`` / ``async_exec()`` and ``pb_utils.load_model`` / ``unload_model`` /
``is_model_ready`` reach the calling model's server's hooks (``triton_python_backend_utils.serving``:
a :class:`ServerHooks` per server, which the server hands to the models it loads); :class:`ServerCalls`
fills its server's. A BLS request goes through :class:`~.dataplane.DataPlane` like a client's (routing table,
validation, the target's own scheduler and batching), so any model that plane serves can be called.

Threads: the hooks are called on the calling model's instance thread (or a thread or greenlet it
started, or the instance's asyncio loop for ``async_exec``); the work runs in a greenlet on the hub
(:class:`~..runtime.hub_calls.HubCalls`) and the answer comes back through a
:class:`~..runtime.hub_calls.ThreadInbox` (or the asyncio loop's ``call_soon_threadsafe``). A model promoted to
run in a hub greenlet of its own (:class:`~..runtime.bridge.InlineRun`, actors/scheduling/instance.py) is
served on that greenlet: the same work, with no thread crossing, waiting cooperatively (a target that runs
inline runs on the same stack). Called anywhere else on the hub's thread (a model run inline on someone's
stack) a hook raises :class:`~..runtime.bridge.RunOnThread`: the instance re-runs the batch on its thread,
so the hub never waits for itself. Owner: the server creates one with its hooks, fills them at start and empties them at stop.
Failure: an inference error becomes ``response.has_error()`` with Triton's text; a BLS call that
would wait for itself forever (see :mod:`.bls_waits`) gets an UNAVAILABLE error instead of hanging;
model-control errors raise ``TritonModelException``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import gevent
import gevent.event

from ..actors.scheduling.ensemble import ensemble_of
from ..backends.python import triton_python_backend_utils as pb_utils
from ..backends.python.triton_python_backend_utils import serving
from ..backends.python.triton_python_backend_utils.serving import ServerHooks
from ..errors import TritonError, answered
from ..inference import InferInput, InferRequest, InferResponse, RequestedOutput
from ..protocol.dtypes import BY_ENUM_VALUE, BY_NUMPY, from_numpy
from ..runtime.bridge import (
    SERVER_CALL,
    HubSignal,
    InlineRun,
    NativeWorker,
    RunOnThread,
    current_worker,
    inline_run,
    this_thread_hub,
)
from ..runtime.hub_calls import HubCalls, ThreadInbox, wait_on_hub
from ..runtime.response_channel import STREAM_MAX_BYTES, STREAM_MAX_RESPONSES, ChannelResponses
from ..runtime.threads import native_lock
from .bls_waits import WaitGraph
from .dataplane import DataPlane
from .route import Route

_END = object()  # the end of a decoupled BLS stream in its inbox
_tensor = pb_utils.Tensor._trusted
_plain_response = pb_utils.InferenceResponse._trusted


class ServerCalls:
    """The hooks a Python model calls: BLS and model control, on the hub of this process."""

    def __init__(self, plane: DataPlane, hooks: ServerHooks | None = None) -> None:
        self.plane = plane
        self.hooks = hooks if hooks is not None else ServerHooks()  # this server's, handed to its models
        self._calls: HubCalls | None = None  # its watcher exists while the hooks are installed
        self._hub = this_thread_hub()
        self._waits = WaitGraph(composite_of=partial(ensemble_of, lambda: plane.repository.routes))

    def install(self) -> None:
        """Hub thread: fill this server's hooks (and answer threads without a server when alone)."""
        self._calls = HubCalls()
        hooks = self.hooks
        hooks.bls_executor = self.exec
        hooks.bls_async_executor = self.async_exec
        hooks.model_control = self
        serving.install(hooks)

    def uninstall(self) -> None:
        hooks = self.hooks
        serving.uninstall(hooks)
        hooks.bls_executor = hooks.bls_async_executor = hooks.model_control = None
        if self._calls is not None:
            self._calls.close()
            self._calls = None

    # -- any thread but the hub's -----------------------------------------------------------------
    def _off_hub(self) -> NativeWorker[Any] | None:
        """The calling instance's worker (None for other threads); refuse the hub itself."""
        if this_thread_hub() is self._hub:
            raise RunOnThread(SERVER_CALL)
        if self._calls is None:
            raise pb_utils.TritonModelException("the server is not running: it cannot serve this call")
        worker = current_worker()
        if worker is not None:
            worker.calls_server = True
        return worker

    def _inline(self) -> InlineRun:
        """Hub thread: the calling greenlet's run, where a call is served in place; else RunOnThread."""
        run = inline_run()
        if run is None or run.in_call:  # not a run of its own, or model code run on a caller's stack
            raise RunOnThread(SERVER_CALL)
        if self._calls is None:
            raise pb_utils.TritonModelException("the server is not running: it cannot serve this call")
        return run

    def exec(self, request: Any, decoupled: bool) -> Any:
        """``InferenceRequest.exec``: one ``InferenceResponse``, or an iterator of them (decoupled)."""
        if this_thread_hub() is self._hub:
            return self._exec_inline(request, decoupled)
        worker = self._off_hub()
        infer_request, names = _to_infer_request(request)
        if decoupled:
            return _stream(self._calls, self._stream_on_hub, infer_request, worker, names)
        result = wait_on_hub(self._calls, self._infer_on_hub, infer_request, worker)
        return _to_pb_response(result, names)

    def _exec_inline(self, request: Any, decoupled: bool) -> Any:
        """:meth:`exec` from a run in a hub greenlet of its own: served on this greenlet."""
        run = self._inline()
        infer_request, names = _to_infer_request(request)
        if decoupled:  # the pump is a greenlet as for a thread; the iterator waits cooperatively here
            run.calls += 1
            return _stream(self._calls, self._stream_on_hub, infer_request, run.worker, names)
        mark = run.waiting()
        try:
            result = self._infer_on_hub(infer_request, run.worker)
        finally:
            run.resumed(mark)
        return _to_pb_response(result, names)

    def async_exec(self, request: Any, decoupled: bool) -> Any:
        """``InferenceRequest.async_exec``: a future of the running asyncio loop. Decoupled, it gives
        the same streamed iterator as ``exec`` once the first response (or error) is in, as Triton's
        python backend does; a future cancelled (or dropped) before that cancels the target in turn."""
        worker = self._off_hub()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        infer_request, names = _to_infer_request(request)
        if decoupled:
            _stream(self._calls, self._stream_on_hub, infer_request, worker, names, _AsyncHandOver(loop, future))
            return future

        def done(ok: bool, value: Any) -> None:  # hub thread: hand over to the loop's thread
            loop.call_soon_threadsafe(_settle, future, ok, value, names)

        self._calls.submit(self._infer_on_hub, (infer_request, worker), done)
        return future

    def load_model(self, model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
        parameters: dict[str, Any] = dict(files or {})
        if config:
            parameters["config"] = config
        self._control(self.plane.load_model, model_name, parameters)

    def unload_model(self, model_name: str, unload_dependents: bool = False) -> None:
        self._control(self.plane.unload_model, model_name, bool(unload_dependents))

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        version = int(model_version) if str(model_version).strip() else -1
        try:
            return bool(self._control(self.plane.model_ready, model_name, version))
        except pb_utils.TritonModelException:
            return False

    def _control(self, fn: Any, *args: Any) -> Any:
        if this_thread_hub() is self._hub:
            run = self._inline()
            mark = run.waiting()
            try:
                return fn(*args)
            except TritonError as e:
                raise pb_utils.TritonModelException(e.message) from None
            finally:
                run.resumed(mark)
        self._off_hub()
        try:
            return wait_on_hub(self._calls, fn, *args)
        except TritonError as e:
            raise pb_utils.TritonModelException(e.message) from None

    # -- hub greenlets ----------------------------------------------------------------------------
    def _enter(self, request: InferRequest, worker: NativeWorker[Any] | None) -> tuple[Route, tuple[str, int] | None]:
        """The request's route, once its target is ready; record that ``worker`` waits for it and refuse a
        wait that never ends. Triton's python backend asks ``ModelIsReady`` first and answers its own text."""
        route = self.plane.loaded(self.plane.route(request.model_name, request.model_version, internal=True),
                                  request.timeout_us)
        if route.target is None:
            raise TritonError.internal(
                f"Failed for execute the inference request. Model '{request.model_name}' is not ready.")
        if worker is None:
            return route, None
        target = (request.model_name, route.target.version)
        if not self._waits.enter(worker, target):
            raise TritonError.unavailable(
                f"BLS request to model '{target[0]}' version {target[1]} would wait forever: every instance of it "
                "is busy waiting, directly or through other models, for this request's caller (a BLS cycle); "
                "give the model more instances or break the cycle")
        return route, target

    def _infer_on_hub(self, request: InferRequest, worker: NativeWorker[Any] | None) -> InferResponse | TritonError:
        try:
            request = _bls_traced(request)
            route, target = self._enter(request, worker)
        except TritonError as e:
            return answered(e)  # the model's answer: its traceback held this frame, which holds it
        try:
            return _answer(route, request)
        except TritonError as e:
            return answered(e)
        finally:
            if target is not None:
                self._waits.leave(worker, target)

    def _stream_on_hub(self, request: InferRequest, worker: NativeWorker[Any] | None, inbox: ThreadInbox,
                       reading: _Reading) -> None:
        """Pump a streamed inference into ``inbox``: ``(item, final, size)``, then ``_END``. It waits while
        the model has not taken :data:`STREAM_MAX_RESPONSES` of them or :data:`STREAM_MAX_BYTES`, so the
        target's ``send()`` waits in turn (response_channel.py) instead of filling memory: a model that
        asked for 2000 responses of 1 MB and read none held 2 GB. Once the model cancelled its iterator,
        or dropped it, the next response closes the stream (the target then sees ``is_cancelled()``).
        The sizes are the response channel's (each response is measured once, where it is sent)."""
        target = None
        read_on = gevent.event.Event()
        reading.wake = HubSignal(read_on.set)  # the model's thread takes them: it wakes us past the bound
        try:
            request = _bls_traced(request)
            route, target = self._enter(request, worker)
            responses = self.plane.infer_stream(request, internal=True, route=route).responses
            count = size_sum = 0
            for item, final, size in _sized(responses):
                if not _wait_for_room(reading, read_on, count, size_sum):  # cancelled, or dropped unread
                    responses.close()  # type: ignore[attr-defined]
                    break
                count, size_sum = count + 1, size_sum + size
                inbox.put((item, final, size))
                reading.started()
        except TritonError as e:
            inbox.put((e, True, 0))
        except Exception as e:  # noqa: BLE001 - a bug of ours must still end the model's stream
            inbox.put((TritonError.internal(f"BLS stream failed: {e!r}"), True, 0))
        finally:
            reading.close()
            if target is not None:
                self._waits.leave(worker, target)
            inbox.put(_END)
            reading.started()  # an error, or no response at all: the iterator is handed over all the same


def _answer(route: Route, request: InferRequest) -> InferResponse:
    """Hub greenlet: ``request`` served by the version of ``route`` (just routed by ``_enter``, with no
    yield since), as ``DataPlane.infer`` serves an internal request, minus its second routing."""
    return route.serving().infer(request).get()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any, names: tuple[str, ...] | None) -> None:
    """The asyncio loop's thread: complete an ``async_exec`` future."""
    if future.cancelled():
        return
    if not ok:
        future.set_exception(value)
    else:
        future.set_result(_to_pb_response(value, names))


def _sized(responses: Iterator[tuple[Any, bool]]) -> Iterator[tuple[Any, bool, int]]:
    """Hub greenlet: ``(item, final, size)`` of a streamed inference, sized by its response channel
    (a non-decoupled target's single response counts 0: it never waits)."""
    if isinstance(responses, ChannelResponses):
        return iter(responses.next_sized, None)
    return ((item, final, 0) for item, final in responses)


class ResponseIterator:
    """What ``exec(decoupled=True)`` returns, and awaiting ``async_exec(decoupled=True)`` gives: the
    target's responses as they come (the last one may have no outputs: a final flag without a
    response). ``next()`` blocks the calling thread (the asyncio loop's too, as Triton's does).
    ``cancel()`` stops reading; the target sees ``is_cancelled()`` once the stream is closed."""

    def __init__(self, inbox: ThreadInbox, names: tuple[str, ...] | None, reading: _Reading) -> None:
        self._inbox = inbox
        self._names = names
        self._done = False
        self._reading = reading  # what the pump on the hub reads: taken so far, cancelled

    @property
    def cancelled(self) -> bool:
        return self._reading.cancelled

    def __del__(self) -> None:
        self.stop()  # dropped unread: the pump stops and the target is cancelled

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> Any:
        value, size = self._next()
        self.took(1, size)
        return _to_pb_response(value, self._names)

    def next_sized(self) -> tuple[Any, int]:
        """Like ``next()`` for a relay whose reader is in another process (an isolated model,
        ``backends/python/isolated.py``): the response and the bytes the pump counted for it, *not*
        counted as taken; the relay reports what its reader took with :meth:`took`, so the pump keeps
        the bound on what the model itself has not taken. Raises StopIteration at the end."""
        value, size = self._next()
        return _to_pb_response(value, self._names), size

    def took(self, responses: int, size: int) -> None:
        """The model took ``responses`` more (``size`` bytes as the pump counted them): the pump may go
        on. One thread only: the reader's (``next()``), or a relay's (see :meth:`next_sized`)."""
        reading = self._reading
        reading.count, reading.bytes = reading.count + responses, reading.bytes + size  # ints: one writer, the GIL
        if reading.waiting:
            reading.wake_pump()

    def stop(self) -> None:
        """Any thread: cancel the target, as :meth:`cancel` does, without touching the inbox (its reader's):
        the pump closes the stream at the target's next response and ends the inbox."""
        self._reading.cancelled = True
        self._reading.wake_pump()

    def _next(self) -> tuple[Any, int]:
        if self._done:
            raise StopIteration
        item = self._inbox.get()
        if item is _END:  # always after the final response: the pump on the hub is finished
            self._done = True
            self._inbox.close()
            raise StopIteration
        value, _final, size = item
        return value, size

    def cancel(self) -> None:
        """Stop yielding; the stream is closed at the target's next response, which then sees
        ``is_cancelled()`` (responses produced meanwhile are dropped)."""
        if not self._done:
            self._inbox.close()
        self._done = self._reading.cancelled = True
        self._reading.wake_pump()


class _Reading:
    """What a model has read of a decoupled BLS stream (written by its thread, read by the pump), the
    pump's wake-up while it waits at the bound (``waiting``), and for ``async_exec`` how the iterator
    reaches the model once the first item is in (``hand_over``, called once, in the hub)."""

    __slots__ = ("count", "bytes", "cancelled", "waiting", "wake", "hand_over", "_lock")

    def __init__(self, hand_over: Callable[[], None] | None = None) -> None:
        self.count = self.bytes = 0
        self.cancelled = self.waiting = False
        self.wake: HubSignal | None = None  # the pump's (made and closed in the hub)
        self.hand_over = hand_over
        self._lock = native_lock()  # a send never meets the close

    def wake_pump(self) -> None:
        """Any thread: the pump looks again (nothing once it is done)."""
        with self._lock:
            if self.wake is not None:
                self.wake.send()

    def started(self) -> None:
        """Hub: the first item is in the inbox (or the stream ended): hand the iterator over, once. The
        pump holds the iterator only until then: dropped after, it is freed, and the target cancelled."""
        hand_over, self.hand_over = self.hand_over, None
        if hand_over is not None:
            hand_over()

    def close(self) -> None:
        with self._lock:
            wake, self.wake = self.wake, None
        if wake is not None:
            wake.close()


def _wait_for_room(reading: _Reading, read_on: gevent.event.Event, count: int, size_sum: int) -> bool:
    """Hub greenlet (the pump): wait while the model has not taken :data:`STREAM_MAX_RESPONSES` of the
    ``count`` put so far or :data:`STREAM_MAX_BYTES` of their ``size_sum``; False once it cancelled."""
    while not reading.cancelled and (count - reading.count >= STREAM_MAX_RESPONSES
                                     or size_sum - reading.bytes > STREAM_MAX_BYTES):
        read_on.clear()
        reading.waiting = True  # set, then looked again: the reader sees one or we see its count
        if reading.cancelled or (count - reading.count < STREAM_MAX_RESPONSES
                                 and size_sum - reading.bytes <= STREAM_MAX_BYTES):
            break
        read_on.wait()
    reading.waiting = False
    return not reading.cancelled


class _AsyncHandOver:
    """``async_exec(decoupled=True)``: its future gets the iterator on the asyncio loop's thread once the
    pump has the first item. A future nobody holds any more, or that is done (cancelled: an
    ``asyncio.wait_for`` that timed out...) does not get it: the iterator is dropped here, which cancels
    the target, instead of waiting in the loop's queue for a loop that may not run again until the
    model's next ``execute``. The future is held weakly for that (a model awaiting it holds it)."""

    __slots__ = ("_loop", "_future", "reader")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self._loop = loop
        self._future = weakref.ref(future)
        self.reader: ResponseIterator | None = None  # set by _stream, dropped once handed over

    def __call__(self) -> None:
        """Hub thread (``done()`` only reads the future's state: it changes on the loop's thread)."""
        reader, self.reader = self.reader, None
        future = self._future()
        if future is None or future.done():
            return  # nobody will read it: dropped here, it cancels the target
        try:
            self._loop.call_soon_threadsafe(_hand_over, future, reader)
        except RuntimeError:  # the loop is closed
            pass


def _hand_over(future: asyncio.Future[Any], reader: ResponseIterator) -> None:
    """The asyncio loop's thread (the reader's)."""
    if future.cancelled():
        reader.cancel()
    else:
        future.set_result(reader)


def _ignore(_ok: bool, _value: Any) -> None:
    """The pump reports through the inbox itself (it always ends with ``_END``)."""


def _stream(calls: HubCalls, fn: Any, request: InferRequest, worker: NativeWorker[Any] | None,
            names: tuple[str, ...] | None, hand_over: _AsyncHandOver | None = None) -> ResponseIterator:
    inbox = ThreadInbox()
    reading = _Reading(hand_over)
    reader = ResponseIterator(inbox, names, reading)
    if hand_over is not None:
        hand_over.reader = reader  # held until the first item is in, then only by the future
    calls.submit(fn, (request, worker, inbox, reading), _ignore)  # not the reader: dropping it must free it
    return reader


def _to_infer_request(pb: Any) -> tuple[InferRequest, tuple[str, ...] | None]:
    """A model's ``pb_utils.InferenceRequest`` as the data plane takes it (no copies of the arrays), and the
    output names it asks for (None: all). Its constructor made the names and strings ``str`` (names taken
    from a BYTES tensor arrive as bytes: Triton's example does that) and the numbers ``int``."""
    inputs = {}
    for tensor in pb.inputs():
        array, name = tensor._array, tensor._name
        inputs[name] = InferInput(name, BY_ENUM_VALUE[tensor._triton_dtype], array.shape, array)
    names = tuple(pb.requested_output_names()) or None
    outputs = None if names is None else tuple(map(RequestedOutput, names))
    # trace=request.trace(): the caller's trace, made the child's on the hub (_bls_traced)
    trace = getattr(pb._trace, "_span_trace", None) if pb._trace is not None else None
    return InferRequest(pb.model_name(), pb.model_version(), pb.request_id(), inputs, outputs, pb._parameters_dict(),
                        False, 0, pb.timeout(), pb.correlation_id(), pb.flags(), trace=trace), names


def _bls_traced(request: InferRequest) -> InferRequest:
    """A request given its caller's trace (OpenTelemetry mode): with the child trace of its own (hub)."""
    return request if request.trace is None else request._replace(trace=request.trace.bls_child())


def _to_pb_response(result: Any, names: tuple[str, ...] | None) -> Any:
    """What the server answered, as a ``pb_utils.InferenceResponse`` (requested outputs only)."""
    if result is None:  # a final flag without a response
        return pb_utils.InferenceResponse()
    if isinstance(result, TritonError):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError._of(result.message, result.code))
    if isinstance(result, BaseException):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(result)))
    tensors = []
    for name, array in result.outputs:
        if names is not None and name not in names:
            continue
        dtype = BY_NUMPY.get(array.dtype)  # a dict look-up for the usual types
        if dtype is None:
            dtype = from_numpy(array.dtype)
        tensors.append(_tensor(name, array, dtype.enum_value if dtype else pb_utils.TYPE_STRING))
    if result.parameters:
        return pb_utils.InferenceResponse(tensors, parameters=result.parameters)
    return _plain_response(tensors)

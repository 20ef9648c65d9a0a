"""The Python backend: runs Triton ``model.py`` files (``class TritonPythonModel``) unchanged, in-process.

Triton runs each instance in a stub process; we run it on the instance's native thread, which is
why a request costs microseconds here instead of an IPC round trip. How ``model.py`` is imported
(a fresh package per instance) is ``model_import.py``'s.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import sys
import traceback
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format

from ...errors import Code, TritonError
from ...inference import InferRequest, InferResponse
from ...repository import config as config_mod
from ...repository.config import ModelConfig
from ...runtime import fastpath
from ...runtime.bridge import RunOnThread
from ...runtime.loop_thread import LoopThread
from ...runtime.threads import native_thread_id
from ..base import IMPORT_LOCK, RESCHEDULE, BackendInstance, InstanceContext, Result
from . import response_rules as rules
from . import stub_argv
from . import triton_python_backend_utils as pb_utils
from .model_import import MODEL_ERRORS, forget_package, import_model, python_error_text
from .stub_argv import as_stub
from .triton_python_backend_utils import serving
from .triton_python_backend_utils.requests import _ServedRequest

# model.py files do `import triton_python_backend_utils as pb_utils`: serve them our module.
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

__all__ = ["MODEL_ERRORS", "PythonBackend", "PythonInstance", "forget_package", "import_model", "python_error_text"]
log = logging.getLogger(__name__)


class PythonBackend:
    """Backend factory for ``backend: "python"``."""

    name = "python"

    def __init__(self, backend_config: dict[str, dict[str, str]] | None = None) -> None:
        self._own = (backend_config or {}).get("python", {})  # --backend-config=python,<key>=<value>

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                      explicit: frozenset[str] = frozenset()) -> None:
        """Call ``TritonPythonModel.auto_complete_config`` when the model defines it (native thread);
        an isolated model's ``model.py`` is imported in a process of its own for that too."""
        if version_dir is None:
            return
        filename = config.default_model_filename or "model.py"
        from . import isolated  # lazy: the isolated model's process imports this module without it

        if isolated.isolation_mode(config.parameters, self._own) == "process":
            isolated.auto_complete(config, version_dir, filename)
            return
        with IMPORT_LOCK:
            self._auto_complete(config, version_dir, filename)

    def _auto_complete(self, config: ModelConfig, version_dir: Path, filename: str) -> None:
        module = import_model(config.name, version_dir, filename, "autocomplete")
        try:
            hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
            if hook is None:
                return
            helper = pb_utils.ModelConfig(config_mod.to_json_dict(config))
            try:
                with as_stub():
                    result = hook(helper)
            except MODEL_ERRORS as e:
                raise TritonError.internal(python_error_text(e)) from None  # the stub's text: the error itself
        finally:
            forget_package(module.__name__.rpartition(".")[0])
        if not isinstance(result, pb_utils.ModelConfig):  # Triton's stub refuses anything else, None included
            raise TritonError.internal(f"auto_complete_config function in model '{config.name}' must return a valid "
                                       "pb.ModelConfig object.")
        completed = result.as_dict()
        config.Clear()
        try:
            json_format.ParseDict(completed, config)
        except json_format.ParseError as e:
            raise TritonError.invalid_arg(f"model '{config.name}': auto_complete_config returned an invalid config: {e}") from None

    def create(self, ctx: InstanceContext) -> BackendInstance:
        from . import isolated

        if isolated.isolation_mode(ctx.config.parameters, ctx.backend_config) == "process":
            return isolated.IsolatedInstance(ctx)
        return PythonInstance(ctx)


def _may_run_inline(ctx: InstanceContext, model: Any, decoupled: bool) -> bool:
    """Whether short executions of this model may run in the calling greenlet (actors/scheduling/instance.py).

    Decided from what the model is, with no parameter needed: a CPU instance whose ``execute`` is a
    plain function and which answers within ``execute`` (not decoupled: a decoupled model's threads
    outlive the call, and on the hub they would compete with the network). Whether its code ever used
    gevent machinery on its own thread (so it may own objects only that thread's hub can wake) is
    watched at run time by the instance; such a model is never promoted. The config parameter
    ``inline_execution: "false"`` keeps a model on its thread regardless (Triton ignores it).
    """
    param = ctx.config.parameters.get("inline_execution")
    if param is not None and param.string_value.strip().lower() in ("false", "no", "0", "off"):
        return False
    execute = getattr(model, "execute", None)
    return ctx.kind == "CPU" and not decoupled and execute is not None and not inspect.iscoroutinefunction(execute)


class PythonInstance:
    """One ``TritonPythonModel`` object. Every method runs in the instance's native thread."""

    def __init__(self, ctx: InstanceContext) -> None:
        self.ctx = ctx
        # model code runs as its server's: pb_utils calls (BLS, model control, MetricFamily) reach that server
        self._server = ctx.server_hooks
        filename = ctx.config.default_model_filename or "model.py"
        # sys.argv is the stub's from here until finalize: once per load, not twice per call (stub_argv.py)
        stub_argv.enter()
        self._argv_held = True
        try:
            # the module's top-level code runs under the backends' import lock (inside import_model);
            # initialize() runs in parallel with other models' loads (--model-load-thread-count)
            with serving.using(self._server), serving.outside_execute():
                module = import_model(ctx.model_name, ctx.version_dir, filename, f"v{ctx.version}_i{ctx.index}")
                self._package = module.__name__.rpartition(".")[0]
                try:
                    self._init(module)
                except BaseException:
                    forget_package(self._package)
                    raise
        except BaseException:
            self._release_argv()
            raise

    def _init(self, module: types.ModuleType) -> None:
        ctx = self.ctx
        self._thread = native_thread_id()  # the instance's own: execute elsewhere runs inline on the hub
        # the server's hooks stay current after a call, in the thread or greenlet that ran it (serving.py):
        # a ContextVar read per call instead of a set and a reset; with fast paths off, set and reset
        self._hooks_stay = fastpath.enabled and self._server is not None
        self.model = module.TritonPythonModel()
        self.decoupled = ctx.config.model_transaction_policy.decoupled
        # fast paths: a batch of one request of a model that answers from execute runs in execute's own frame,
        # its request built lean (pb_utils' _ServedRequest); otherwise the general path
        self._one = fastpath.enabled and not self.decoupled  # no server (a benchmark): _enter(None) sets nothing
        self._build = _served_lean if fastpath.enabled else _served
        self.inline_ok = _may_run_inline(ctx, self.model, self.decoupled)
        self._sender = partial(_sender_on_thread, self)
        self.observes_cancellation = not self.decoupled  # decoupled requests read their ResponseChannel
        self._loop: LoopThread | None = None  # Triton's stub makes it at the first coroutine
        init = getattr(self.model, "initialize", None)
        if init is not None:
            args = {
                "model_config": ctx.config_json,
                "model_instance_kind": ctx.kind,
                "model_instance_name": ctx.instance_name,
                "model_instance_device_id": str(ctx.device_id),
                "model_repository": str(ctx.model_dir),
                "model_version": str(ctx.version),
                "model_name": ctx.model_name,
            }
            try:
                with as_stub():
                    self._await(init(args))
            except MODEL_ERRORS as e:
                raise TritonError.internal(python_error_text(e, ctx.public_paths)) from None

    def _loop_thread(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    def _await(self, value: Any) -> Any:
        """A coroutine (or other awaitable) runs on the instance's loop, which runs forever on a thread
        of its own (Triton's stub: tasks the model started go on after the call); this thread waits."""
        if inspect.isawaitable(value):
            return self._loop_thread().wait(_awaiting(value), contextvars.copy_context())
        return value

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        """On the instance's thread, or inline in a hub greenlet.

        Fast paths: one request (the usual batch of a model run inline, or of a pipeline step) of a model
        that answers from ``execute`` runs in this frame, its request built lean (pb_utils'
        ``_ServedRequest``) and the usual answer (one plain response, no sender asked for, not rescheduled)
        taken here; anything else goes the general way (``_answers``) with the same objects."""
        # a length test, not an unpacking in a try: a dynamic batcher's batch would raise at every call
        if not self._one or len(requests) != 1:
            return self._execute_general(requests)
        request = requests[0]
        if _current_hooks() is not self._server:
            _enter(self._server)
        pb = _served_lean(request, self._sender if native_thread_id() == self._thread else _back_to_thread)
        pb_requests = [pb]
        try:
            responses = self.model.execute(pb_requests)
        except MODEL_ERRORS as e:
            return self._failed(pb_requests, e)
        if type(responses) is list:
            if pb._untouched and len(responses) == 1:
                response = responses[0]
                if type(response) is _Response and response._plain:  # exact Tensors, no error, no parameters
                    tensors = response._output_tensors
                    if len(tensors) == 1:  # not unpacked in a try: a model of two outputs would raise every call
                        t = tensors[0]
                        outputs = [(t._name, t._array)]
                    else:
                        outputs = [(t._name, t._array) for t in tensors]
                    # every field stored here, without the dataclass __init__'s frame (398 -> 285 ns a response)
                    answer = _new(InferResponse)
                    answer.outputs = outputs
                    answer.parameters = {}
                    answer.timings = None
                    return [answer]
        else:
            try:
                responses = self._await(responses)
            except MODEL_ERRORS as e:
                return self._failed(pb_requests, e)
        return self._answers(pb_requests, responses)

    def _execute_general(self, requests: list[InferRequest]) -> list[Result]:
        if self._hooks_stay:
            if _current_hooks() is not self._server:
                _enter(self._server)
            if self.decoupled:
                return self._execute_decoupled(requests)
            return self._execute(requests)
        token = _enter(self._server)
        try:
            if self.decoupled:
                return self._execute_decoupled(requests)
            return self._execute(requests)
        finally:
            _leave(token)

    def _failed(self, pb_requests: list[Any], e: BaseException) -> list[Result]:
        failed = rules.fail_default(pb_requests, self._model_error(e))
        return [r if isinstance(r, TritonError) else self._from_pb(r) for r in failed]

    def _execute(self, requests: list[InferRequest]) -> list[Result]:
        # inline (on the hub), a model that answers through a sender goes back to its thread: its
        # response may come from a thread of its own after execute returned, and waiting must not block the hub
        sender = self._sender if native_thread_id() == self._thread else _back_to_thread
        # one request (the usual inline batch): no comprehension (a function call of its own)
        build = self._build
        pb_requests = [build(requests[0], sender)] if len(requests) == 1 else [build(r, sender) for r in requests]
        try:
            responses = self.model.execute(pb_requests)
            if type(responses) is not list:  # a list is never awaitable: skip the awaitable test
                responses = self._await(responses)
        except MODEL_ERRORS as e:
            return self._failed(pb_requests, e)
        return self._answers(pb_requests, responses)

    def _answers(self, pb_requests: list[Any], responses: Any) -> list[Result]:
        """What ``execute`` returned for ``pb_requests``, checked as Triton's stub checks it, as results."""
        requests = pb_requests
        if responses is None:  # answered through response senders (Triton's default-mode senders)
            responses = [None] * len(requests)
        elif type(responses) is not list and not isinstance(responses, list):
            return [self._returned_error(f"Expected a list in the execute return, found type '{type(responses)}'.")
                    ] * len(requests)
        elif len(responses) != len(requests):
            return [self._returned_error(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(responses)}\n")
            ] * len(requests)
        if len(responses) == 1:  # one request (the usual inline batch): no zip, no comprehension
            return [self._result_of(pb_requests[0], responses[0])]
        return [self._result_of(pb, r) for pb, r in zip(pb_requests, responses, strict=True)]

    def _result_of(self, pb: Any, response: Any) -> Result:
        if pb._release_flags == _RELEASE_RESCHEDULE:  # its response is None (Triton's rule)
            return RESCHEDULE
        if response is None:  # sent through the sender, maybe later by the model's own thread
            return self._from_pb(rules.wait_sent(pb, self.ctx.instance_name))
        if pb._response_sender is not None:
            response = rules.take_returned(pb, response)
        return self._from_pb(response)

    def _returned_error(self, message: str) -> TritonError:
        return TritonError.internal(
            f"Failed to process the request(s) for model '{self.ctx.instance_name}', message: {message}")

    def _execute_decoupled(self, requests: list[InferRequest]) -> list[Result]:
        """Responses travel through each request's sender into its ResponseChannel, from ``execute``
        or later from a thread the model started; the result here only says whether ``execute`` ran.
        An error from ``execute`` reaches the client as the final response of requests not finished yet."""
        pb_requests = []
        for r in requests:
            channel = r.responses
            if channel is None:
                return [TritonError.unsupported(
                    f"model '{self.ctx.model_name}' is decoupled: it answers only streaming requests")] * len(requests)
            pb = _served(r)
            pb._response_sender = pb_utils.InferenceResponseSender(self._deliverer(channel), channel.is_cancelled)
            pb._cancelled = channel.is_cancelled
            pb_requests.append(pb)
        try:
            returned = self.model.execute(pb_requests)
            if inspect.iscoroutine(returned):  # Triton's stub runs it in the background, on the model's loop
                self._in_background(returned, pb_requests)
                return [None] * len(requests)
            returned = self._await(returned)
        except MODEL_ERRORS as e:
            return rules.fail_decoupled(pb_requests, self._model_error(e))  # type: ignore[return-value]
        if returned is not None:
            error = rules.must_return_none(self.ctx.instance_name)
            log.error("%s", error.message)
            return rules.fail_decoupled(pb_requests, error)  # type: ignore[return-value]
        # None: execute ran, the responses travel through the senders; a request the model released
        # with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE comes back in a later execute, same sender
        return [RESCHEDULE if pb._release_flags == _RELEASE_RESCHEDULE else None  # type: ignore[misc]
                for pb in pb_requests]

    def _in_background(self, coroutine: Any, pb_requests: list[Any]) -> None:
        """A decoupled ``async def execute`` runs on the loop while the instance takes the next batch, so
        coroutines of several batches overlap. What it raises is logged (as Triton's stub logs it) and
        ends the requests it left open with that error (Triton's leave their clients waiting)."""

        def done(future: Any) -> None:  # the loop's thread
            error = None if future.cancelled() else future.exception()
            if error is None:
                return
            failure = self._model_error(error)
            for pb, open_ in zip(pb_requests, rules.close_senders(pb_requests), strict=True):
                if open_:
                    pb._response_sender._deliver(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError._of(failure.message, failure.code)), True)

        self._loop_thread().submit(coroutine, contextvars.copy_context(), done)

    def _deliverer(self, channel: Any) -> Callable[[Any, bool], None]:
        def deliver(response: Any, final: bool) -> None:
            channel.send(None if response is None else self._from_pb(response), final)

        return deliver

    def _model_error(self, e: BaseException) -> TritonError:
        log.error("model '%s' execute raised:\n%s", self.ctx.model_name, "".join(traceback.format_exception(e)))
        return TritonError.internal(
            f"Failed to process the request(s) for model '{self.ctx.instance_name}', message: "
            f"{python_error_text(e, self.ctx.public_paths)}"
        )

    def _from_pb(self, response: Any) -> Result:
        if type(response) is _Response and response._error is None and response._parameters is None:
            # the usual response: its own tensors (no subclass may override name()/as_numpy()), no error,
            # no parameters; pb_utils.Tensor always holds an ndarray
            outputs = []
            for t in response._output_tensors:
                if type(t) is not _Tensor:
                    break
                outputs.append((t._name, t._array))
            else:
                return InferResponse(outputs, {})
        if response is None:
            return TritonError.internal(f"model '{self.ctx.model_name}' returned None instead of an InferenceResponse")
        if response.has_error():
            err = response.error()
            return TritonError(Code(err.code()), err.message())
        outputs = [(t.name(), _output_array(t)) for t in response.output_tensors()]
        # the constructor already validated them; read the dict instead of a JSON round trip per request
        params = response._parameters
        if isinstance(params, str):
            params = json.loads(params)
        return InferResponse(outputs, dict(params) if params else {})

    def finalize(self) -> None:
        fin = getattr(self.model, "finalize", None)
        try:
            if fin is not None:
                with serving.using(self._server), serving.outside_execute(), as_stub():
                    self._await(fin())
        finally:
            self._release_argv()
            if self._loop is not None:
                self._loop.close()
            forget_package(self._package)
            # the model's memory goes now, even while something still holds this instance (a connection's
            # cached route to the unloaded version): the memory budget measures right after an unload
            self.model = None

    def _release_argv(self) -> None:
        if self._argv_held:  # once, whether finalize runs once or again
            self._argv_held = False
            stub_argv.leave()


def _sender_on_thread(instance: PythonInstance, request: Any) -> Any:
    """A model on its thread asks for a response sender: it may send after ``execute`` returned, which
    only its thread can wait for, so it is never run on the hub (before, it was promoted and its first
    inline batch, asking again, ran twice; a caller of the server could make a call first and then could
    not be run again)."""
    instance.inline_ok = False
    return rules.default_mode_sender(request)


def _back_to_thread(_request: Any) -> Any:
    """A model running inline asks for a response sender: run the batch again on its thread (for good)."""
    raise RunOnThread()


async def _awaiting(value: Any) -> Any:
    return await value


def _output_array(tensor: Any) -> np.ndarray:
    if isinstance(tensor, _Tensor) and tensor._triton_dtype == pb_utils.TYPE_BF16:
        return tensor._array  # BF16 has no as_numpy(); its bit patterns, in the dtype the encoders read as BF16
    value = tensor.as_numpy()
    return value if isinstance(value, np.ndarray) else np.asarray(value)


_RELEASE_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
_enter, _leave, _current_hooks = serving.enter, serving.leave, serving.peek
_served = pb_utils.InferenceRequest._served
_new = object.__new__
_served_lean = _ServedRequest._served_lean
_Response = pb_utils.InferenceResponse
_Tensor = pb_utils.Tensor


def _to_pb(request: InferRequest, sender_factory: Callable[[Any], Any] | None = None) -> Any:
    """The ``pb_utils.InferenceRequest`` a model's ``execute`` gets for ``request`` (benchmarks call it)."""
    return (_served_lean if fastpath.enabled else _served)(request, sender_factory)

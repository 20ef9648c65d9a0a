"""Python models behave as in Triton's python backend stub (python_backend ``pb_stub.cc``,
``response_sender.cc``, ``infer_request.cc``; Triton's ``qa/L0_backend_python`` response_sender,
async_execute and argument_validation cases): the response-sender rules, a decoupled ``async def
execute`` running in the background on the model's loop, ``sys.argv == ['']`` in model code, and BLS
refused outside ``execute``. Each test runs in-process and isolated. Real servers, the official
tritonclient; the models wait on events of their own (files, asyncio events), never on time."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import wait_for
from .server import add_model
from .test_isolation_parity import ISOLATION

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
{extra}
"""
DECOUPLED = "model_transaction_policy { decoupled: True }"

COMMON = """
import asyncio, sys, threading
import numpy as np
import triton_python_backend_utils as pb_utils

NOTES = {notes!r}

def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])

def note(text):
    with open(NOTES, "a") as f:
        f.write(text + "\\n")

def later(returned, work):
    # runs on a thread of the model once execute has returned (it sets ``returned`` last)
    def run():
        returned.wait()
        try:
            work()
        except Exception as e:
            note(f"{{type(e).__name__}}: {{e}}")
    threading.Thread(target=run, daemon=True).start()
"""

SENDER_PY = COMMON + """
class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        sender = requests[0].get_response_sender()
        returned = threading.Event()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            if self.name == "decoupled_returns":  # Triton: an error and the final flag
                return [answer(1)]
            if self.name == "decoupled_after":  # responses and the final flag after execute returned
                later(returned, lambda: (sender.send(answer(1)), sender.send(answer(2)), sender.send(flags=final)))
                return None
            if self.name == "late":  # non-decoupled: the response comes after execute returned None
                later(returned, lambda: (sender.send(answer(7)), sender.send(flags=final)))
                return None
            if self.name == "sent_then_returned":  # the sent response wins, the returned one is dropped
                sender.send(answer(1), final)
                return [answer(2)]
            if self.name == "returned_then_sent":  # the returned response counts as sent: no more
                later(returned, lambda: sender.send(answer(2), final))
                return [answer(1)]
            if self.name == "final_first":
                sender.send(flags=final)
            return [answer(0)]
        finally:
            returned.set()
"""

ASYNC_SENDER_PY = COMMON + """
class TritonPythonModel:
    async def execute(self, requests):
        sender = requests[0].get_response_sender()
        async def after():  # a task of the model's loop, still running after execute returned
            await returned.wait()
            sender.send(answer(5), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        returned = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(after())
        returned.set()
        return None
"""

SENDER_MODELS = ("decoupled_returns", "decoupled_after", "late", "sent_then_returned", "returned_then_sent",
                 "final_first")


def _sender_repo(tmp_path: Path) -> tuple[Path, Path]:
    notes, repo = tmp_path / "notes.txt", tmp_path / "repo"
    for name in SENDER_MODELS:
        extra = DECOUPLED if name.startswith("decoupled") else ""
        add_model(repo, name, CONFIG.format(name=name, extra=extra), SENDER_PY.format(notes=str(notes)))
    add_model(repo, "async_late", CONFIG.format(name="async_late", extra=""), ASYNC_SENDER_PY.format(notes=str(notes)))
    return repo, notes


def _http(client: httpclient.InferenceServerClient, model: str) -> Any:
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([0], np.int32))
    return client.infer(model, [i]).as_numpy("OUT").tolist()


def _stream(server: Any, model: str, count: int = 1) -> list[tuple[Any, Any]]:
    """Send ``count`` requests on one stream; every response and error until each request's final flag."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([0], np.int32))
        for _ in range(count):
            client.async_stream_infer(model, [i], enable_empty_final_response=True)
        items, finals = [], 0
        while finals < count:
            result, error = got.get(timeout=30)
            items.append((result, error))
            final = error is not None or result.get_response().parameters["triton_final_response"].bool_param
            finals += final
    finally:
        client.stop_stream()
        client.close()
    return items


def _outputs(items: list[tuple[Any, Any]]) -> list[Any]:
    return [r.as_numpy("OUT").tolist() if e is None and r.as_numpy("OUT") is not None else str(e)
            for r, e in items if e is not None or r.as_numpy("OUT") is not None]


@ISOLATION
def test_response_sender_rules(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    repo, notes = _sender_repo(tmp_path)
    server = start_server(repo, flags=flags)
    [(result, error)] = _stream(server, "decoupled_returns")
    assert result is None and ("Python model 'decoupled_returns_0' is using the decoupled mode and the execute "
                               "function must return None.") in str(error)
    assert _outputs(_stream(server, "decoupled_after")) == [[1], [2]]
    with httpclient.InferenceServerClient(server.url) as client:
        assert _http(client, "late") == [7]
        assert _http(client, "async_late") == [5]
        assert _http(client, "sent_then_returned") == [1]
        assert _http(client, "returned_then_sent") == [1]
        with pytest.raises(InferenceServerException) as refused:
            _http(client, "final_first")
        assert ("Unable to send response. Non-decoupled model cannot send complete final before sending a "
                "response.") in str(refused.value)
    wait_for(lambda: notes.exists() and "one response" in notes.read_text(), what="the late send to be refused")
    assert notes.read_text() == ("TritonModelException: Unable to send response. Non-decoupled model cannot send "
                                 "more than one response.\n")


# decoupled, ``async def execute``: each request waits until all four have started, which only
# happens when the coroutines overlap on the model's loop (one at a time, the first waits for ever)
OVERLAP_PY = COMMON + """
class TritonPythonModel:
    def initialize(self, args):
        self.started = 0
        self.all_started = None

    async def execute(self, requests):
        if self.all_started is None:
            self.all_started = asyncio.Event()
        self.started += len(requests)
        if self.started >= 4:
            self.all_started.set()
        try:
            await asyncio.wait_for(self.all_started.wait(), 30)
            value = self.started
        except asyncio.TimeoutError:
            value = -1
        for r in requests:
            r.get_response_sender().send(answer(value), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@ISOLATION
def test_decoupled_async_execute_runs_concurrently(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "overlap", CONFIG.format(name="overlap", extra=DECOUPLED), OVERLAP_PY.format(notes=""))
    server = start_server(repo, flags=flags)
    assert sorted(_outputs(_stream(server, "overlap", count=4))) == [[4]] * 4


ARGV_PY = COMMON + """
import unittest

AT_IMPORT = list(sys.argv)

class Check(unittest.TestCase):
    def test_it(self):
        self.assertTrue(True)

class TritonPythonModel:
    def initialize(self, args):
        self.at_init = list(sys.argv)

    def execute(self, requests):
        # Triton's QA models run their checks this way; argparse reads sys.argv
        run = unittest.main(module=sys.modules[__name__], exit=False, argv=None)
        seen = AT_IMPORT == self.at_init == sys.argv == [""]
        return [answer(int(seen and run.result.wasSuccessful())) for _ in requests]
"""


@ISOLATION
def test_models_see_the_argv_of_tritons_stub(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "argv", CONFIG.format(name="argv", extra=""), ARGV_PY.format(notes=""))
    server = start_server(repo, flags=flags)
    with httpclient.InferenceServerClient(server.url) as client:
        assert _http(client, "argv") == [1]


BLS_PY = COMMON + """
def bls_exec():
    return pb_utils.InferenceRequest(model_name="bls_finalize", requested_output_names=["OUT"],
                                     inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))]).exec()

async def bls_async_exec():
    return await pb_utils.InferenceRequest(model_name="bls_finalize", requested_output_names=["OUT"],
                                           inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))]).async_exec()

class TritonPythonModel:
    def initialize(self, args):
        if args["model_name"] == "bls_initialize":
            bls_exec()
        if args["model_name"] == "bls_initialize_async":
            asyncio.run(bls_async_exec())

    def execute(self, requests):
        return [answer(1) for _ in requests]

    def finalize(self):
        try:
            bls_exec()
        except pb_utils.TritonModelException as e:
            note(f"finalize: {{e}}")
"""


@ISOLATION
def test_bls_is_refused_outside_execute(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    notes, repo = tmp_path / "notes.txt", tmp_path / "repo"
    for name in ("bls_initialize", "bls_initialize_async", "bls_finalize"):
        add_model(repo, name, CONFIG.format(name=name, extra=""), BLS_PY.format(notes=str(notes)))
    server = start_server(repo, flags=("--exit-on-error=false", *flags))
    with httpclient.InferenceServerClient(server.url) as client:
        index = {e["name"]: e for e in client.get_model_repository_index()}
        for name in ("bls_initialize", "bls_initialize_async"):
            assert index[name]["state"] == "UNAVAILABLE"
            assert "BLS is only supported during the 'execute' function." in index[name]["reason"]
        assert _http(client, "bls_finalize") == [1]
    server.stop()
    assert notes.read_text() == "finalize: BLS is only supported during the 'execute' function.\n"


# Triton's qa/L0_backend_python argument_validation checks (triton-inference-server/server, Copyright
# 2022-2024 NVIDIA CORPORATION & AFFILIATES, BSD-3-Clause: redistribution with this notice), as exact
# types: where pybind11 refuses an argument Triton raises a plain TypeError, where the stub's code does
# a TritonModelException (measured on Triton 2.51 with a probe model: scripts/triton_reference/NOTES.md)
ARGUMENTS_PY = COMMON + """
T = pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))
R = dict(model_name="m", inputs=[T], requested_output_names=["o"])
CHECKS = [
    ("pb_utils.InferenceRequest(inputs=[None], model_name='m', requested_output_names=['o'])", "TritonModelException"),
    ("pb_utils.InferenceRequest(inputs=None, model_name='m', requested_output_names=['o'])", "TypeError"),
    ("pb_utils.InferenceRequest(**dict(R, model_name=None))", "TypeError"),
    ("pb_utils.InferenceRequest(**dict(R, requested_output_names=[None]))", "TypeError"),
    ("pb_utils.InferenceRequest(**dict(R, requested_output_names=None))", "TypeError"),
    ("pb_utils.InferenceRequest(**R, correlation_id=None)", "TypeError"),
    ("pb_utils.InferenceRequest(**R, request_id=None)", "TypeError"),
    ("pb_utils.InferenceRequest(**R, model_version=None)", "TypeError"),
    ("pb_utils.InferenceRequest(**R, flags=None)", "TypeError"),
    ("pb_utils.InferenceRequest(**R, correlation_id=1.5)", "TritonModelException"),
    ("pb_utils.InferenceRequest(**dict(R, requested_output_names=['']))", "TritonModelException"),
    ("pb_utils.InferenceResponse(output_tensors=[None])", "TritonModelException"),
    ("pb_utils.InferenceResponse(output_tensors=None)", "TypeError"),
    ("pb_utils.Tensor(None, np.zeros(1))", "TypeError"),
    ("pb_utils.Tensor('OUTPUT0', None)", "TypeError"),
    ("pb_utils.Tensor('', None)", "TypeError"),
    ("pb_utils.Tensor('', np.zeros(1))", "TritonModelException"),
    ("pb_utils.Tensor.from_dlpack('OUTPUT0', None)", "TritonModelException"),
    ("pb_utils.Tensor.from_dlpack('', None)", "TritonModelException"),
    ("pb_utils.Logger.log('Invalid Level', None)", "TypeError"),
    ("pb_utils.Logger.log('Invalid Level', 1)", "TypeError"),
    ("pb_utils.Logger.log_info(None)", "TypeError"),
    ("pb_utils.Logger.log_warn(None)", "TypeError"),
    ("pb_utils.Logger.log_error(None)", "TypeError"),
    ("pb_utils.Logger.log_verbose(None)", "TypeError"),
    ("pb_utils.TritonError('x', 3)", "TypeError"),
    ("pb_utils.InferenceRequest(**R, correlation_id=5).correlation_id() == 5", None),
    ("pb_utils.InferenceRequest(**R, correlation_id='id-5').correlation_id() == 'id-5'", None),
    ("pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name='m') is not None", None),
    ("pb_utils.InferenceResponse(output_tensors=[]) is not None", None),
    ("pb_utils.Logger.log('Level unspecified') is None", None),
]

class TritonPythonModel:
    def execute(self, requests):
        ok = True
        for code, expected in CHECKS:
            try:
                result, raised = eval(code), None
            except Exception as e:
                result, raised = None, type(e).__name__
            if raised != expected or (expected is None and result is not True):
                ok = False
                note(f"{{code}}: raised {{raised}}, expected {{expected}}")
        return [answer(int(ok)) for _ in requests]
"""


@ISOLATION
def test_argument_checks_raise_tritons_exception_types(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    notes, repo = tmp_path / "notes.txt", tmp_path / "repo"
    add_model(repo, "arguments", CONFIG.format(name="arguments", extra=""), ARGUMENTS_PY.format(notes=str(notes)))
    server = start_server(repo, flags=flags)
    with httpclient.InferenceServerClient(server.url) as client:
        answer = _http(client, "arguments")
    assert (notes.read_text() if notes.exists() else "") == ""
    assert answer == [1]

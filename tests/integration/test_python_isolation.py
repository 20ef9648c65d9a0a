"""Process isolation for Python models (``TRITON_ACTOR_ISOLATION`` / ``--backend-config=python,isolation=process``):
the model runs in a child process; crashes fail its requests only, and it is restarted.
Real servers, the official tritonclient; models written per test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gevent
import gevent.queue
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .bls_models import SQUARE_CONFIG, SQUARE_PY, caller_repo
from .model_control import Hammer, index, wait_for
from .server import IDENTITY_CONFIG, IDENTITY_PY, ROOT, ServerProcess, add_model
from .test_bls import test_bls_from_a_thread_of_a_decoupled_model as bls_from_a_decoupled_models_thread
from .test_lifecycle import BAD_INIT_PY

ISOLATED = '\nparameters { key: "TRITON_ACTOR_ISOLATION" value { string_value: "process" } }\n'
SERVER_WIDE = ("--backend-config=python,isolation=process",)

# OUTPUT0 = the pid of the process execute() ran in; 13 segfaults, 7 leaves with os._exit(1)
CRASHY_PY = """
import ctypes
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == 13:
                ctypes.string_at(0)
            if x[0] == 7:
                os._exit(1)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.full(x.shape, os.getpid(), np.float32))]))
        return out

    def finalize(self):
        pb_utils.Logger.log_info(f"crashy finalized in pid {os.getpid()}")
"""

CRASH_AT_INIT_PY = """
import ctypes

class TritonPythonModel:
    def initialize(self, args):
        ctypes.string_at(0)

    def execute(self, requests):
        return []
"""

# starts once; crashes in execute, and in every initialize after that
FLAKY_PY = """
import ctypes
import os

MARK = {mark!r}

class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(MARK):
            ctypes.string_at(0)

    def execute(self, requests):
        open(MARK, "w").close()
        ctypes.string_at(0)
"""

# decoupled: responses every 5 ms until the request is cancelled (at most 2000), then a line in LOG
UNTIL_CANCELLED_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

LOG = {log!r}

class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        for i in range(2000):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            time.sleep(0.005)  # the model's pace: cancelled midway
        with open(LOG, "w") as f:
            f.write("cancelled" if requests[0].is_cancelled() else "never cancelled")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# one scenario per INPUT0[0]; OUTPUT0 (BYTES) = the args of initialize as JSON
PARITY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

PARITY_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        mode = int(x[0])
        pb_utils.Logger.log_info(f"parity model runs mode {mode}")
        if mode == 1:
            raise ValueError("bad value " + str(mode))
        if mode == 2:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("custom failure", pb_utils.TritonError.INVALID_ARG))]
        if mode == 3:
            return []
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([json.dumps(self.args).encode()], dtype=object))])]
"""

def _infer(client: httpclient.InferenceServerClient, model: str, values: list[float]) -> np.ndarray:
    i = httpclient.InferInput("INPUT0", [len(values)], "FP32")
    i.set_data_from_numpy(np.array(values, np.float32))
    return client.infer(model, [i]).as_numpy("OUTPUT0")


def _error(call: Any, *args: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call(*args)
    return e.value


def _pid_of(client: httpclient.InferenceServerClient, model: str) -> int:
    return int(_infer(client, model, [0.0])[0])


def _gone(pid: int) -> bool:
    """No process, not even a zombie: it was reaped."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def crashy_server(tmp_path: Path, start_server: Any) -> ServerProcess:
    add_model(tmp_path, "crashy", IDENTITY_CONFIG + ISOLATED, CRASHY_PY)
    add_model(tmp_path, "other", IDENTITY_CONFIG, IDENTITY_PY)  # in-process
    return start_server(tmp_path)


def test_add_sub_unchanged_runs_isolated(tmp_path: Path, start_server: Any) -> None:
    shutil.copytree(ROOT / "model_repository" / "add_sub", tmp_path / "add_sub",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "add_sub" / "config.pbtxt").open("a") as f:
        f.write(ISOLATED)
    server = start_server(tmp_path)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 2, np.float32)
    for mod, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = mod.InferenceServerClient(url)
        inputs = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.close()
    assert "instance add_sub_0_0 runs in its own process" in server.log()


def test_segfault_fails_its_request_and_the_model_restarts(crashy_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(crashy_server.url)
    first = _pid_of(client, "crashy")
    assert first != crashy_server.proc.pid
    others = Hammer(crashy_server.url, "other", clients=2)  # another model, served throughout
    try:
        e = _error(_infer, client, "crashy", [13.0])
        assert e.status() == "500"
        assert e.message() == ("Failed to process the request(s) for model 'crashy_0', message: the model's process "
                               "exited with signal 11 (SIGSEGV) while it ran them; the next requests start a new one")
        second = _pid_of(client, "crashy")
        wait_for(lambda: len(others.answers) >= 10, what="the other model answering")
    finally:
        others.stop()
    assert not others.failures, others.failures[:3]
    assert second not in (first, crashy_server.proc.pid)
    assert _gone(first)
    assert crashy_server.stderr.wait(lambda: "Fatal Python error: Segmentation fault" in crashy_server.log(), 30)  # the child's stderr
    client.close()


def test_os_exit_in_execute(crashy_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(crashy_server.url)
    first = _pid_of(client, "crashy")
    e = _error(_infer, client, "crashy", [7.0])
    assert "the model's process exited with code 1 while it ran them" in e.message()
    assert _pid_of(client, "crashy") != first
    np.testing.assert_array_equal(_infer(client, "other", [1.0, 2.0]), [1.0, 2.0])
    client.close()


def test_killed_while_idle_restarts_at_the_next_request(crashy_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(crashy_server.url)
    first = _pid_of(client, "crashy")
    os.kill(first, 9)
    wait_for(lambda: _gone(first), what="the killed process reaped")
    assert _pid_of(client, "crashy") not in (first, 0)
    assert crashy_server.stderr.wait(lambda: "the model's process exited with signal 9 (SIGKILL)" in crashy_server.log(), 30)
    client.close()


def test_crash_in_initialize_fails_the_load(tmp_path: Path, start_server: Any) -> None:
    add_model(tmp_path, "crash_init", IDENTITY_CONFIG + ISOLATED, CRASH_AT_INIT_PY)
    add_model(tmp_path, "other", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    client = httpclient.InferenceServerClient(server.url)
    entry = index(client)[("crash_init", "1")]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == ("Internal: failed to load model 'crash_init': the model's process exited with signal 11 "
                               "(SIGSEGV) during initialize")
    np.testing.assert_array_equal(_infer(client, "other", [3.0]), [3.0])
    client.close()


def test_restarts_are_bounded(tmp_path: Path, start_server: Any) -> None:
    """The process is restarted at once after the crash, out of the scheduler's pool; three failed starts
    and the instance is DOWN: its only instance gone, the version is not ready (tests/integration/test_instance_health.py)."""
    add_model(tmp_path, "flaky", IDENTITY_CONFIG + ISOLATED, FLAKY_PY.format(mark=str(tmp_path / "crashed")))
    add_model(tmp_path, "other", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    assert "exited with signal 11 (SIGSEGV) while it ran them" in _error(_infer, client, "flaky", [1.0]).message()
    gave_up = ("model 'flaky' instance 'flaky_0': its process could not be restarted (3 attempts, the last: failed to "
               "load model 'flaky': the model's process exited with signal 11 (SIGSEGV) during initialize); load the "
               "model again")
    wait_for(lambda: not client.is_model_ready("flaky"), what="'flaky' not ready")
    assert index(client)[("flaky", "1")]["reason"] == f"no instance left: {gave_up}"
    e = _error(_infer, client, "flaky", [1.0])
    assert (e.status(), e.message()) == ("404", "Request for unknown model: 'flaky' has no available versions")
    assert server.stderr.wait(lambda: server.log().count("restarting its process failed") >= 3, 30)
    assert server.log().count("restarting its process failed") == 3
    np.testing.assert_array_equal(_infer(client, "other", [3.0]), [3.0])
    client.close()


def test_unload_finalizes_and_stops_the_process(tmp_path: Path, start_server: Any) -> None:
    add_model(tmp_path, "crashy", IDENTITY_CONFIG + ISOLATED, CRASHY_PY)
    server = start_server(tmp_path, flags=("--model-control-mode=explicit", "--load-model=crashy"))
    client = httpclient.InferenceServerClient(server.url)
    pid = _pid_of(client, "crashy")
    client.unload_model("crashy")
    wait_for(lambda: _gone(pid), what="the model's process gone")
    assert server.stderr.wait(lambda: f"crashy finalized in pid {pid}" in server.log(), 30)  # finalize ran there
    client.load_model("crashy")
    assert _pid_of(client, "crashy") != pid
    client.close()


def _collect(out: gevent.queue.Queue, result: Any, error: Any) -> None:
    out.put((result, error))


def _stream(client: grpcclient.InferenceServerClient, out: gevent.queue.Queue, n: int) -> list[Any]:
    """Send IN=n on the open stream; every (OUT value or error text) up to the final response."""
    i = grpcclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([n], np.int32))
    client.async_stream_infer("square", [i], enable_empty_final_response=True)
    got: list[Any] = []
    while True:
        result, error = out.get(timeout=30)
        if error is not None:
            return [*got, str(error)]
        response = result.get_response()
        if response.outputs:
            got.append(int(result.as_numpy("OUT")[0]))
        if response.parameters["triton_final_response"].bool_param:
            return got


@contextlib.contextmanager
def _open_stream(server: ServerProcess, cancel: bool = False) -> Iterator[tuple[Any, gevent.queue.Queue]]:
    """A gRPC stream whose (result, error) pairs land in the queue; ``cancel``: its requests are
    cancelled when it closes."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    out: gevent.queue.Queue = gevent.queue.Queue()
    client.start_stream(callback=partial(_collect, out))
    try:
        yield client, out
    finally:
        client.stop_stream(cancel_requests=cancel)
        client.close()


def test_decoupled_streams_through_the_process(tmp_path: Path, start_server: Any) -> None:
    add_model(tmp_path, "square", SQUARE_CONFIG + ISOLATED, SQUARE_PY)
    with _open_stream(start_server(tmp_path)) as (client, out):
        assert _stream(client, out, 5) == [0, 1, 2, 3, 4]
        assert _stream(client, out, 0) == []
        assert _stream(client, out, 3) == [0, 1, 2]


def test_a_decoupled_model_sees_the_client_cancel(tmp_path: Path, start_server: Any) -> None:
    """Forwarded when the server gets the model's next response after the client went away."""
    log = tmp_path / "model.log"
    add_model(tmp_path / "repo", "square", SQUARE_CONFIG + ISOLATED, UNTIL_CANCELLED_PY.format(log=str(log)))
    with _open_stream(start_server(tmp_path / "repo"), cancel=True) as (client, out):
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([1], np.int32))
        client.async_stream_infer("square", [i])
        for _ in range(3):
            assert out.get(timeout=30)[1] is None
    wait_for(lambda: log.exists() and log.read_text() != "", what="the model to finish")
    assert log.read_text() == "cancelled"


def test_bls_from_a_thread_of_an_isolated_decoupled_model(bls_servers: tuple[ServerProcess, ServerProcess]) -> None:
    """Responses sent from a thread the model started, and BLS calls made while no execute() runs
    (each served on a native thread of its own): test_bls's scenario, on the isolated server."""
    bls_from_a_decoupled_models_thread(bls_servers[1])


@pytest.fixture(scope="module")
def parity_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """One repository, served in-process and with every Python model isolated (the server-wide flag)."""
    repo = tmp_path_factory.mktemp("parity")
    add_model(repo, "parity", PARITY_CONFIG, PARITY_PY)
    add_model(repo, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    flags = ("--exit-on-error=false",)
    servers = (ServerProcess(repo, flags=flags), ServerProcess(repo, flags=(*flags, *SERVER_WIDE)))
    try:
        yield tuple(s.wait_ready() for s in servers)  # type: ignore[misc]
    finally:
        for s in servers:
            s.stop()


def _outcome(server: ServerProcess, mode: int) -> Any:
    client = httpclient.InferenceServerClient(server.url)
    try:
        i = httpclient.InferInput("INPUT0", [1], "FP32")
        i.set_data_from_numpy(np.array([mode], np.float32))
        result = client.infer("parity", [i])
        return json.loads(result.as_numpy("OUTPUT0")[0])
    except InferenceServerException as e:
        return (e.status(), e.message())
    finally:
        client.close()


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_same_args_and_error_texts_as_in_process(parity_servers: tuple[ServerProcess, ServerProcess],
                                                 mode: int) -> None:
    in_process, isolated = parity_servers
    assert "instance parity_0 runs in its own process" in isolated.log()
    expected = _outcome(in_process, mode)
    assert _outcome(isolated, mode) == expected
    if mode == 0:
        assert expected["model_name"] == "parity" and expected["model_instance_name"] == "parity_0"
    else:
        assert expected[0] in ("400", "500")
    # pb_utils logging, forwarded: written before the reply, read by this process's log reader a moment later
    assert isolated.stderr.wait(lambda: f"parity model runs mode {mode}" in isolated.log(), 30)


def test_initialize_error_text_as_in_process(parity_servers: tuple[ServerProcess, ServerProcess]) -> None:
    reasons = []
    for server in parity_servers:
        client = httpclient.InferenceServerClient(server.url)
        reasons.append(index(client)[("bad_init", "1")]["reason"])
        client.close()
    assert reasons[0] == reasons[1]
    assert reasons[0].startswith("Internal: RuntimeError: initialize failed on purpose")


@pytest.fixture(scope="module")
def bls_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    repo = caller_repo(tmp_path_factory.mktemp("bls_isolated"))
    servers = (ServerProcess(repo), ServerProcess(repo, flags=SERVER_WIDE))
    try:
        yield tuple(s.wait_ready() for s in servers)  # type: ignore[misc]
    finally:
        for s in servers:
            s.stop()


def _bls(server: ServerProcess, model: str, mode: str) -> Any:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        i = httpclient.InferInput("MODE", [1], "BYTES")
        i.set_data_from_numpy(np.array([mode.encode()], dtype=object))
        answer = json.loads(client.infer(model, [i]).as_numpy("OUT")[0])
    finally:
        client.close()
    return _without_tid(answer)


def _without_tid(value: Any) -> Any:
    """The answer less the calling thread's id (it differs between any two servers)."""
    if isinstance(value, dict):
        return {k: _without_tid(v) for k, v in value.items() if k != "tid"}
    return value


@pytest.mark.parametrize(("model", "mode"), [
    ("caller", "sync"), ("caller", "outputs"), ("caller", "unknown"), ("caller", "wrong_inputs"),
    ("caller", "decoupled"), ("caller", "cancel"), ("caller", "ready"), ("caller", "self"),
    ("caller", "to:caller_b:sync"), ("caller_async", "gather"), ("caller_async", "decoupled"),
])
def test_bls_from_an_isolated_model(bls_servers: tuple[ServerProcess, ServerProcess], model: str, mode: str) -> None:
    in_process, isolated = bls_servers
    assert "instance caller_0_0 runs in its own process" in isolated.log()
    assert _bls(isolated, model, mode) == _bls(in_process, model, mode)

"""The fault suite (docs/testing.md#faults-and-soak): one fault at a time, through the real server, under traffic.

In every test background clients (official ``tritonclient``, HTTP and gRPC, :class:`~.traffic.Traffic`)
keep asking a healthy model (and the faulty one where it still serves) while the fault happens; the
test asserts that every request that should have succeeded did, and that the failing ones failed with
Triton's error (status and text) instead of hanging. Models that must be caught mid-execution wait on
a gate file; the tests wait on conditions, never on time.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.runtime import fastpath

from .clients import PROTOCOLS, Client
from .model_control import ask, index, tagged, wait_for
from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model, gated_model_py
from .traffic import Traffic, ask_once, identity_call

# An identity model that fails on chosen inputs: -1 raises an Exception, -2 SystemExit (sys.exit()),
# -3 KeyboardInterrupt, -4 ends its thread (_thread.exit()), -6 a BaseException of its own.
FAULTY_PY = """
import _thread
import sys
import triton_python_backend_utils as pb_utils

class Fatal(BaseException):
    pass

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == -1:
                raise ValueError("negative input")
            if x[0] == -2:
                sys.exit("the model called sys.exit")
            if x[0] == -3:
                raise KeyboardInterrupt("the model was interrupted")
            if x[0] == -4:
                _thread.exit()
            if x[0] == -6:
                raise Fatal("a BaseException of the model")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

GATED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def _ask(client: Client, model: str, value: float, **kw: object) -> float:
    x = client.input("INPUT0", np.array([value], np.float32), "FP32")
    return float(client.infer(model, [x], **kw).as_numpy("OUTPUT0")[0])


def _fails(client: Client, model: str, value: float, **kw: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        _ask(client, model, value, **kw)
    return e.value


class Gate:
    """A gated model's execution log and gate file (see ``server.gated_model_py``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.log, self.path = tmp_path / "executions.log", tmp_path / "gate"

    def model_py(self) -> str:
        return gated_model_py(self.log, self.path, hold_s=600)

    def executed(self) -> list[str]:
        """The first values of the requests that ran, in order ("1", "2", ...)."""
        return [f"{float(v):g}" for v in self.log.read_text().split()] if self.log.exists() else []

    def wait_executing(self, n: int, server: ServerProcess) -> None:
        wait_for(lambda: self.executed().count("1") >= n, 60, f"{n} requests held in execute:\n{server.log()}")

    def open(self) -> None:
        self.path.write_text("open")


@pytest.fixture
def connect() -> Iterator[Callable[[str, ServerProcess], Client]]:
    """``connect(protocol, server)``: a :class:`Client`, closed after the test (open gRPC channels
    would keep the test process from exiting)."""
    made: list[Client] = []

    def make(protocol: str, server: ServerProcess) -> Client:
        made.append(Client(protocol, server))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _round_trips(server: ServerProcess, n: int = 5) -> None:
    """Requests through the server's hub after what the test just did: it has been read and acted on."""
    c = httpclient.InferenceServerClient(server.url)
    try:
        for _ in range(n):
            assert c.is_server_live()
    finally:
        c.close()


# -- execute raises --------------------------------------------------------------------------------
def test_execute_raises_fails_that_request_only(tmp_path: Path, start_server, connect) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "faulty", IDENTITY_CONFIG, FAULTY_PY)
    server = start_server(tmp_path)
    good, faulty = Traffic(server, "good"), Traffic(server, "faulty")
    faulty.wait_answers(100)  # long enough for a promotion to inline execution (fast paths on)
    clients = [connect(p, server) for p in PROTOCOLS]
    for i in range(20):
        client = clients[i % 2]
        e = _fails(client, "faulty", -1)
        assert client.status(e) == client.expect("INTERNAL", 500)
        assert e.message().startswith("Failed to process the request(s) for model 'faulty_0', message: "
                                      "ValueError: negative input\n\nAt:\n"), e.message()
    faulty.wait_answers(50, "the faulty model to keep serving")
    good.assert_all_succeeded()
    faulty.assert_all_succeeded()
    assert all(_ask(c, "faulty", 7.0) == 7.0 for c in clients)


# -- a model ends its own thread or the process ----------------------------------------------------
@pytest.mark.parametrize(("value", "text"), [
    (-2, "SystemExit: the model called sys.exit\n\nAt:\n"),
    (-3, "KeyboardInterrupt: the model was interrupted\n\nAt:\n"),
    (-4, "SystemExit: \n\nAt:\n"),
], ids=["sys.exit", "KeyboardInterrupt", "_thread.exit"])
def test_model_exiting_in_execute_fails_that_request_only(tmp_path: Path, start_server, connect, value: int, text: str) -> None:
    """SystemExit and KeyboardInterrupt are BaseExceptions: raised by a model promoted to run inline
    they reached gevent's hub, which re-raised them in the main greenlet and the server exited (before
    the fix). They are the model's error for that batch, as any exception from ``execute``."""
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "faulty", IDENTITY_CONFIG, FAULTY_PY)
    server = start_server(tmp_path)
    good, faulty = Traffic(server, "good"), Traffic(server, "faulty")
    faulty.wait_answers(100)
    for client in [connect(p, server) for p in PROTOCOLS]:
        for _ in range(3):
            e = _fails(client, "faulty", value)
            assert client.status(e) == client.expect("INTERNAL", 500)
            assert e.message().startswith(
                f"Failed to process the request(s) for model 'faulty_0', message: {text}"), e.message()
    faulty.wait_answers(50, "the faulty model to keep serving")
    good.assert_all_succeeded()
    faulty.assert_all_succeeded()
    assert server.proc.poll() is None


def test_a_base_exception_of_the_model_fails_that_request_only(tmp_path: Path, start_server, connect) -> None:
    """A BaseException subclass of the model's own (not SystemExit, not KeyboardInterrupt): promoted,
    it cut the connection without an answer (before the fix); now it is the batch's INTERNAL error."""
    add_model(tmp_path, "faulty", IDENTITY_CONFIG, FAULTY_PY)
    server = start_server(tmp_path)
    faulty = Traffic(server, "faulty")
    faulty.wait_answers(100)
    for client in [connect(p, server) for p in PROTOCOLS]:
        e = _fails(client, "faulty", -6)
        assert client.status(e) == client.expect("INTERNAL", 500)
        assert "Fatal('a BaseException of the model')" in e.message(), e.message()
    faulty.wait_answers(50, "the faulty model to keep serving")
    faulty.assert_all_succeeded()


# A model with a gevent hub on its thread (it slept in initialize): a greenlet it leaves behind runs
# while the instance waits for work, and gevent re-raises a SystemExit of that greenlet in the thread's
# main greenlet, the instance's loop. Before the fix the thread ended there and every later request
# to the instance waited forever.
STRAY_PY = """
import sys
import time
import gevent
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(0)  # gives the thread its hub (see above)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == -5:
                gevent.spawn(sys.exit, "a greenlet of the model called sys.exit")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_a_greenlet_exiting_on_the_instance_thread_does_not_end_it(tmp_path: Path, start_server, connect) -> None:
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "stray", IDENTITY_CONFIG, STRAY_PY)
    server = start_server(tmp_path)
    good, stray = Traffic(server, "good"), Traffic(server, "stray")
    stray.wait_answers(20)
    client = connect("http", server)
    for _ in range(3):
        assert _ask(client, "stray", -5) == -5.0  # the request itself is answered
        stray.wait_answers(20, "the instance to keep serving after its greenlet exited")
    good.assert_all_succeeded()
    stray.assert_all_succeeded()
    assert "a greenlet of the model called sys.exit" in server.log()


LATE_STRAY_PY = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == -5:  # gevent imported only now: until here the model never touched gevent
                import gevent
                gevent.spawn(sys.exit, "a greenlet of the promoted model called sys.exit")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_a_greenlet_exiting_from_a_model_promoted_to_the_hub_does_not_end_the_server(
        tmp_path: Path, start_server, connect) -> None:
    """A fast model is promoted to run on the hub (fast paths on; actors/scheduling/instance.py); a greenlet it
    spawns there then runs on the server's own loop, whose SystemExit ended the process (runtime/hub_errors.py)."""
    add_model(tmp_path, "late", IDENTITY_CONFIG, LATE_STRAY_PY)
    server = start_server(tmp_path, flags=("--log-verbose=1",))  # the promotion is logged at debug level
    client = connect("http", server)
    for i in range(100):  # past the promotion streak (32)
        assert _ask(client, "late", float(i)) == float(i)
    promoted = fastpath.enabled and server.stderr.wait(lambda: "runs inline from now on" in server.log(), 10)
    assert promoted == fastpath.enabled and (promoted or "runs inline" not in server.log())
    for _ in range(3):
        assert _ask(client, "late", -5) == -5.0
    for i in range(20):
        assert _ask(client, "late", float(i)) == float(i)
    assert server.proc.poll() is None
    assert server.stderr.wait(lambda: "a greenlet of the promoted model called sys.exit" in server.log(), 30)
    # on the hub it is runtime/hub_errors.py that keeps the server up (with fast paths off, the instance thread's hub)
    assert ("only a signal stops the server" in server.log()) == fastpath.enabled


# -- execute hangs past the request's timeout ------------------------------------------------------
HANG_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { default_queue_policy { default_timeout_microseconds: 600000000, allow_timeout_override: true } }
"""


def _batched(client: Client, value: float) -> list:
    x = client.input("INPUT0", np.array([[value]], np.float32), "FP32")
    return [x]


def test_execute_hanging_past_the_timeout(tmp_path: Path, start_server, connect) -> None:
    """One request hangs in execute. Queued behind it: one with Triton's ``timeout`` parameter gets
    UNAVAILABLE "Request timeout expired" while the model still hangs (the queue policy allows the
    override, which in Triton only shortens a default timeout); a gRPC call with a client deadline gets DEADLINE_EXCEEDED and, cancelled, never runs.
    Other models serve throughout; once the hang ends the hung request is answered and the model serves."""
    gate = Gate(tmp_path)
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "hang", HANG_CONFIG, gate.model_py())
    server = start_server(tmp_path)
    good = Traffic(server, "good")
    http, grpc = connect("http", server), connect("grpc", server)
    try:
        hung_call = http.raw.async_infer("hang", _batched(http, 1.0))
        gate.wait_executing(1, server)
        good.wait_answers(20)
        with pytest.raises(InferenceServerException) as timed:
            http.infer("hang", _batched(http, 2.0), timeout=100_000)  # µs: Triton's request timeout
        assert http.status(timed.value) == "503"
        assert timed.value.message() == "[request id: <id_unknown>] Request timeout expired"
        with pytest.raises(InferenceServerException) as deadline:
            grpc.infer("hang", _batched(grpc, 3.0), client_timeout=1)  # seconds: the gRPC deadline
        assert deadline.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert grpc.is_server_live()  # same connection: the server has read the call's RST_STREAM
        assert gate.executed() == ["1"], "a request behind the hung one ran"
        good.wait_answers(20, "the other model to serve while one hangs")
    finally:
        gate.open()
    assert hung_call.get_result().as_numpy("OUTPUT0").tolist() == [[1.0]]
    assert http.infer("hang", _batched(http, 4.0)).as_numpy("OUTPUT0").tolist() == [[4.0]]
    assert grpc.infer("hang", _batched(grpc, 5.0)).as_numpy("OUTPUT0").tolist() == [[5.0]]
    assert gate.executed()[-2:] == ["4", "5"] and "3" not in gate.executed() and "2" not in gate.executed()
    good.assert_all_succeeded()


# -- initialize fails ------------------------------------------------------------------------------
BAD_INIT_PY = """
import sys

class TritonPythonModel:
    def initialize(self, args):
        {fault}

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize(("fault", "reason"), [
    ('raise RuntimeError("initialize failed on purpose")', "Internal: RuntimeError: initialize failed on purpose\n\nAt:\n"),
    ('sys.exit("initialize called sys.exit")', "Internal: SystemExit: initialize called sys.exit\n\nAt:\n"),
], ids=["raises", "sys.exit"])
def test_initialize_failing(tmp_path: Path, start_server, connect, fault: str, reason: str) -> None:
    """At start (``--exit-on-error=false``) and on a load under traffic: the load error is in the index
    and in the load API's answer; the server keeps serving the others. Before the fix a SystemExit
    from initialize() ended the server."""
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY.format(fault=fault))
    server = start_server(tmp_path, flags=("--exit-on-error=false", "--model-control-mode=explicit",
                                           "--load-model=good", "--load-model=bad_init"))
    good = Traffic(server, "good")
    http, grpc = connect("http", server), connect("grpc", server)
    entry = index(http.raw)[("bad_init", "1")]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"].startswith(reason), entry
    good.wait_answers(20)
    for client in (http, grpc):
        with pytest.raises(InferenceServerException) as e:
            client.load_model("bad_init")
        assert client.status(e.value) == client.expect("INVALID_ARGUMENT", 400)
        assert e.value.message().startswith(
            f"load failed for model 'bad_init': version 1 is at UNAVAILABLE state: {reason}"), e.value.message()
        missing = _fails(client, "bad_init", 1.0)
        assert "Request for unknown model: 'bad_init'" in missing.message()
        good.wait_answers(20, "the good model to serve between the failing loads")
    assert index(http.raw)[("bad_init", "1")]["reason"].startswith(reason)
    good.assert_all_succeeded()
    assert server.proc.poll() is None


# -- SIGTERM under load ----------------------------------------------------------------------------
CLEAN_REFUSALS = ("Server not ready", "Connection refused", "connection closed", "Socket closed",
                  "StatusCode.UNAVAILABLE", "failed to connect", "Connection reset", "Broken pipe", "GOAWAY")


def test_sigterm_under_load(tmp_path: Path, start_server) -> None:
    """SIGTERM while clients send and two requests are held in execute: those two and every request
    answered before the signal succeed; requests after it are refused cleanly (Triton's "Server not
    ready", a refused or closed connection) rather than hanging or failing otherwise; exit status 0."""
    gate = Gate(tmp_path)
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "held", GATED_CONFIG.replace("count: 1", "count: 2"), gate.model_py())
    server = start_server(tmp_path)
    good = Traffic(server, "good")
    held = [gevent.spawn(ask_once, p, server, "held", 1.0) for p in PROTOCOLS]
    gate.wait_executing(2, server)
    good.wait_answers(50)
    before, failed_before = good.ok, list(good.failures)
    assert not failed_before, failed_before[:5]  # every request answered before the signal succeeded
    server.proc.send_signal(signal.SIGTERM)
    try:
        wait_for(lambda: "shutting down" in server.log(), 60, "the server to take the signal")
        for protocol in PROTOCOLS:  # a new client is refused
            fresh, close = identity_call(protocol, server, "good")
            with pytest.raises(Exception) as refused:
                fresh(1.0)
            close()
            assert any(s in str(refused.value) for s in CLEAN_REFUSALS), repr(refused.value)
    finally:
        gate.open()
    gevent.joinall(held, timeout=60)
    assert [g.value for g in held] == [1.0, 1.0], [g.exception for g in held]  # the held requests completed
    assert server.wait_exit(60) == 0
    good.stop()
    unclean = [f for f in good.failures if not any(s in f for s in CLEAN_REFUSALS)]
    assert not unclean, unclean[:5]
    print(f"good: {before} answered before SIGTERM, {good.ok} in all, {len(good.failures)} refused cleanly after it")


def test_the_exit_timeout_is_one_deadline_for_the_whole_exit(tmp_path: Path, start_server, connect) -> None:
    """A request stuck in execute: the drain waited --exit-timeout-secs, then the unload at shutdown waited
    it again (32 s with 15). Triton's flag bounds the exit: the unload gets what is left (at least 1 s)."""
    gate = Gate(tmp_path)
    add_model(tmp_path, "hang", HANG_CONFIG, gate.model_py())
    server = start_server(tmp_path, flags=("--exit-timeout-secs", "3"))
    http = connect("http", server)
    try:
        http.raw.async_infer("hang", _batched(http, 1.0))
        gate.wait_executing(1, server)
        assert server.stop() == 0
        assert "request(s) still running after 3 s" in server.log()
        assert "unloading models at shutdown: no answer within 1.0 s" in server.log(), server.log()[-2000:]
    finally:
        gate.open()


# -- config.pbtxt corrupted mid-POLL ---------------------------------------------------------------
def test_config_corrupted_while_polling(tmp_path: Path, start_server) -> None:
    """POLL mode: config.pbtxt is cut off mid-write; the serving version keeps serving (its answers
    unchanged), the index shows the parse error; a fixed file with new code reloads it, no request lost."""
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    model_dir = add_model(tmp_path, "m", IDENTITY_CONFIG, tagged(1))
    server = start_server(tmp_path, flags=("--model-control-mode=poll", "--repository-poll-secs=1"))
    good = Traffic(server, "good")
    m = Traffic(server, "m", check=lambda _sent, got: got in (101.0, 102.0))  # the old code, then the fixed one
    m.wait_answers(20)
    text = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(text[: len(text) // 2])
    http = httpclient.InferenceServerClient(server.url)
    wait_for(lambda: "config.pbtxt" in index(http)[("m", "1")].get("reason", ""), 60, "the parse error in the index")
    assert index(http)[("m", "1")]["state"] == "READY"
    m.wait_answers(20, "the serving version to keep serving")
    (model_dir / "1" / "model.py").write_text(tagged(2))
    (model_dir / "config.pbtxt").write_text(text)
    wait_for(lambda: ask(http, "m") == 102.0, 60, "the fixed model to load")
    assert index(http)[("m", "1")].get("reason", "") == ""
    m.wait_answers(20)
    good.assert_all_succeeded()
    m.assert_all_succeeded()


# -- unload under load -----------------------------------------------------------------------------
def test_unload_under_load(tmp_path: Path, start_server, connect) -> None:
    """EXPLICIT mode: unload a model while one request runs and one is queued. The unload call returns
    at once (Triton's unload is asynchronous); both requests complete; new ones get Triton's "unknown
    model" error from then on; other models serve throughout."""
    gate = Gate(tmp_path)
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "held", GATED_CONFIG, gate.model_py())
    server = start_server(tmp_path, flags=("--model-control-mode=explicit", "--load-model=*"))
    good = Traffic(server, "good")
    http, grpc = connect("http", server), connect("grpc", server)
    try:
        running = gevent.spawn(ask_once, "http", server, "held", 1.0)
        gate.wait_executing(1, server)
        queued = gevent.spawn(ask_once, "grpc", server, "held", 2.0)
        _round_trips(server)
        http.unload_model("held")
        assert not http.is_model_ready("held")
        for client in (http, grpc):
            e = _fails(client, "held", 3.0)
            assert client.status(e) == client.expect("NOT_FOUND", 404), e
            assert e.message() == "Request for unknown model: 'held' has no available versions", e.message()
        good.wait_answers(20, "the good model to serve during the unload")
        assert not running.ready() and not queued.ready()
    finally:
        gate.open()
    gevent.joinall([running, queued], timeout=60)
    assert (running.value, queued.value) == (1.0, 2.0), (running.exception, queued.exception)
    wait_for(lambda: index(http.raw)[("held", "1")]["state"] == "UNAVAILABLE", 60, "the unload to finish")
    for client in (http, grpc):
        e = _fails(client, "held", 4.0)
        assert "Request for unknown model: 'held'" in e.message(), e.message()
    assert gate.executed() == ["1", "2"]
    good.assert_all_succeeded()


# -- a stream client leaving mid-stream ------------------------------------------------------------
STREAMER_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "I", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""

STREAMER_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

LOG = {log!r}

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            for i in range(n):
                if sender.is_cancelled():
                    with open(LOG, "a") as f:
                        f.write(f"cancelled {{r.request_id()}} after {{i}}\\n")
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
                time.sleep(0.005)  # the model's pace: cancelled midway
            else:
                with open(LOG, "a") as f:
                    f.write(f"finished {{r.request_id()}}\\n")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


class _Stream:
    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, rid: str, n: int) -> None:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([n], np.int32))
        self.client.async_stream_infer("streamer", [x], request_id=rid, enable_empty_final_response=True)

    def collect(self, finals: int = 1) -> list[int]:
        """Every index until ``finals`` final flags (one per request sent)."""
        got = []
        for _ in range(100000):
            result, error = self.answers.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                finals -= 1
                if not finals:
                    return got
                continue
            got.append(int(result.as_numpy("I")[0]))
        raise AssertionError("no final response")


def test_stream_client_leaving_mid_stream(tmp_path: Path, start_server) -> None:
    """A gRPC stream client goes away after the first response of a long generation: the model sees
    ``is_cancelled()`` and stops, its instance serves again; the other streams get every response."""
    log = tmp_path / "stream.log"
    add_model(tmp_path, "good", IDENTITY_CONFIG, IDENTITY_PY)
    add_model(tmp_path, "streamer", STREAMER_CONFIG, STREAMER_PY.format(log=str(log)))
    server = start_server(tmp_path)
    good = Traffic(server, "good")
    leaver, stayer = _Stream(server), _Stream(server)
    leaver.send("leaver", 100000)
    stayer.send("stayer", 200)
    result, error = leaver.answers.get(timeout=60)
    assert error is None and int(result.as_numpy("I")[0]) == 0
    leaver.client.stop_stream(cancel_requests=True)
    leaver.client.close()
    wait_for(lambda: log.exists() and "cancelled leaver" in log.read_text(), 60, "the model to see the cancellation")
    assert stayer.collect() == list(range(200))
    stayer.send("a", 50)  # both instances are free again: two requests at once run to the end
    stayer.send("b", 50)
    assert sorted(stayer.collect(finals=2)) == sorted(list(range(50)) * 2)
    stayer.client.stop_stream()
    stayer.client.close()
    assert sorted(line.split()[1] for line in log.read_text().splitlines()) == ["a", "b", "leaver", "stayer"]
    good.assert_all_succeeded()

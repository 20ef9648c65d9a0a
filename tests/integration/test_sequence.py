"""The sequence batcher on a real server, through the official clients (HTTP, gRPC, gRPC streams).

One server per module serves every model here (python models written per test session in a tmp
folder). ``seq`` accumulates its INPUT in implicit state and reports the control tensors it was given
and the batch it ran in, so each answer shows what the batcher did. Error texts and statuses are the
ones real Triton 2.51 gave for the same requests (captured with its python backend).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .clients import PROTOCOLS, Client
from .server import ServerProcess, add_model

REPORT_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

def _get(r, name):
    t = pb_utils.get_input_tensor_by_name(r, name)
    return None if t is None else t.as_numpy()

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = _get(r, "INPUT")
            acc = _get(r, "ACC_IN")
            total = x if acc is None else acc + x
            info = {"start": _get(r, "START").tolist(), "end": _get(r, "END").tolist(),
                    "ready": _get(r, "READY").tolist(), "corrid": [v.decode() if isinstance(v, bytes) else int(v)
                                                              for v in _get(r, "CORRID").flatten()],
                    "cid": r.correlation_id(), "batch": len(requests),
                    "nulls": sum(1 for q in requests if not q.request_id() and q.correlation_id() in (0, ""))}
            tensors = [pb_utils.Tensor("OUTPUT", np.array([[json.dumps(info).encode()]], dtype=object)),
                       pb_utils.Tensor("SUM", total.astype(np.int32))]
            if acc is not None:
                tensors.append(pb_utils.Tensor("ACC_OUT", total.astype(np.int32)))
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""


def _seq_config(name: str, strategy: str = "", corrid: str = "TYPE_UINT64", mbs: int = 4, extra: str = "",
                count: int = 1, state: bool = True) -> str:
    state_block = """
  state [{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1]
           initial_state: { data_type: TYPE_INT32 dims: [1] zero_data: true name: "zero" } }]""" if state else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }}]
output [{{ name: "OUTPUT" data_type: TYPE_STRING dims: [1] }}, {{ name: "SUM" data_type: TYPE_INT32 dims: [1] }}]
instance_group [{{ count: {count} kind: KIND_CPU }}]
sequence_batching {{
  {strategy}
  {extra}
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }}] }},
    {{ name: "END" control [{{ kind: CONTROL_SEQUENCE_END bool_false_true: [false, true] }}] }},
    {{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }}] }}
  ]{state_block}
}}
"""


PLAIN_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[json.dumps(
            {"cid": r.correlation_id(), "flags": r.flags()}).encode()]], dtype=object))]) for r in requests]
"""

PLAIN_CONFIG = """
name: "plain"
backend: "python"
max_batch_size: 4
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUTPUT" data_type: TYPE_STRING dims: [1] }]
"""

# Triton's python_backend test model for iterative sequences, with the correlation id in its output
ITER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            cid = request.correlation_id()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().item()
            if start:
                self.remaining[cid] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.remaining[cid] -= 1
            left = self.remaining[cid]
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([left], np.int32)),
                pb_utils.Tensor("CID", np.array([int(cid)], np.uint64))])
            if left <= 0:
                del self.remaining[cid]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
"""

ITER_CONFIG = """
name: "iter"
backend: "python"
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }, { name: "CID" data_type: TYPE_UINT64 dims: [1] }]
model_transaction_policy { decoupled: true }
sequence_batching {
  iterative_sequence: true
  control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }]
}
"""


# the same loop in a plain (not decoupled) model: rescheduled requests are None in execute's answer
ITER_PLAIN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.steps = {}

    def execute(self, requests):
        out = []
        for request in requests:
            cid = request.correlation_id()
            self.steps[cid] = self.steps.get(cid, 0) + 1
            if self.steps[cid] < int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]):
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([self.steps.pop(cid)], np.int32)),
                    pb_utils.Tensor("CID", np.array([int(cid)], np.uint64))]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("seqrepo")
    add_model(repo, "seq", _seq_config("seq"), REPORT_PY)
    add_model(repo, "seq_str", _seq_config("seq_str", corrid="TYPE_STRING"), REPORT_PY)
    add_model(repo, "seq_idle", _seq_config("seq_idle", extra="max_sequence_idle_microseconds: 300000"), REPORT_PY)
    add_model(repo, "seq_one", _seq_config("seq_one", mbs=0, state=False), REPORT_PY)
    add_model(repo, "seq_one_idle", _seq_config("seq_one_idle", mbs=0, state=False,
                                                 extra="max_sequence_idle_microseconds: 200000"), REPORT_PY)
    add_model(repo, "seq_oldest", _seq_config(
        "seq_oldest", "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 20000000 }"),
        REPORT_PY)
    add_model(repo, "plain", PLAIN_CONFIG, PLAIN_PY)
    add_model(repo, "iter", ITER_CONFIG, ITER_PY)
    add_model(repo, "iter_plain", ITER_CONFIG.replace('"iter"', '"iter_plain"').replace(
        "model_transaction_policy { decoupled: true }", ""), ITER_PLAIN_PY)
    srv = ServerProcess(repo).wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    c = Client(request.param, server)
    yield c
    c.close()


def _infer(c: Client, model: str, value: int, **kw: object) -> tuple[dict, int]:
    x = c.input("INPUT", np.array([value] if model.startswith("seq_one") else [[value]], np.int32), "INT32")
    result = c.raw.infer(model, [x], **kw)
    info = json.loads(result.as_numpy("OUTPUT")[0][0])
    total = result.as_numpy("SUM")
    return info, (None if total is None else int(total.flatten()[0]))


def test_controls_state_and_interleaved_sequences(client: Client) -> None:
    first, total = _infer(client, "seq", 5, sequence_id=101, sequence_start=True)
    assert (first["start"], first["end"], first["ready"], first["corrid"], first["cid"]) == ([[1.0]], [[False]], [[1]], [101], 101)
    assert total == 5
    other, total = _infer(client, "seq", 100, sequence_id=202, sequence_start=True)
    assert total == 100 and other["start"] == [[1.0]]
    mid, total = _infer(client, "seq", 7, sequence_id=101)
    assert (mid["start"], mid["end"], total) == ([[0.0]], [[False]], 12)  # its own state, not 202's
    last, total = _infer(client, "seq", 1, sequence_id=202, sequence_end=True)
    assert (last["start"], last["end"], total) == ([[0.0]], [[True]], 101)
    last, total = _infer(client, "seq", 3, sequence_id=101, sequence_end=True)
    assert total == 15
    # ended: the next request of 101 must start again, and a new START begins from the initial state
    with pytest.raises(InferenceServerException) as e:
        _infer(client, "seq", 1, sequence_id=101)
    assert e.value.message() == ("inference request for sequence 101 to model 'seq' must specify the START flag on the "
                                 "first request of the sequence")
    assert client.status(e.value) == client.expect("INVALID_ARGUMENT", 400)
    _, total = _infer(client, "seq", 4, sequence_id=101, sequence_start=True, sequence_end=True)
    assert total == 4


def test_direct_batch_pads_empty_slots_with_null_requests(client: Client) -> None:
    """Triton's direct strategy: one request per slot up to the highest slot in use, READY false in the gaps."""
    ids = [301, 302, 303]
    for i in ids:
        _infer(client, "seq", 1, sequence_id=i, sequence_start=True)
    _infer(client, "seq", 1, sequence_id=301, sequence_end=True)  # frees slot 0; 302 and 303 keep theirs
    info, _ = _infer(client, "seq", 1, sequence_id=303)
    assert info["batch"] == 3 and info["nulls"] == 2  # slots 0 and 1 were sent as null requests
    for i in (302, 303):
        _infer(client, "seq", 1, sequence_id=i, sequence_end=True)


def test_string_ids(client: Client) -> None:
    info, total = _infer(client, "seq_str", 2, sequence_id="user-a", sequence_start=True)
    assert (info["corrid"], info["cid"], total) == (["user-a"], "user-a", 2)
    _infer(client, "seq_str", 40, sequence_id="user-b", sequence_start=True)
    info, total = _infer(client, "seq_str", 3, sequence_id="user-a", sequence_end=True)
    assert (info["corrid"], info["end"], total) == (["user-a"], [[True]], 5)
    _, total = _infer(client, "seq_str", 2, sequence_id="user-b", sequence_end=True)
    assert total == 42


@pytest.mark.parametrize("kw,text", [
    ({}, "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_start": True}, "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 404}, "inference request for sequence 404 to model 'seq' must specify the START flag on the first "
                           "request of the sequence"),
])
def test_malformed_sequence_requests(client: Client, kw: dict, text: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        _infer(client, "seq", 1, **kw)
    assert e.value.message() == text
    assert client.status(e.value) == client.expect("INVALID_ARGUMENT", 400)


def test_batch_of_two_is_refused(client: Client) -> None:
    x = client.input("INPUT", np.array([[1], [2]], np.int32), "INT32")
    with pytest.raises(InferenceServerException) as e:
        client.raw.infer("seq", [x], sequence_id=9, sequence_start=True)
    assert e.value.message() == ("inference request to model 'seq' must specify batch-size 1 due to requirements of "
                                 "sequence batcher")
    assert client.status(e.value) == client.expect("INVALID_ARGUMENT", 400)


def test_second_start_restarts_the_sequence(client: Client) -> None:
    _infer(client, "seq", 10, sequence_id=55, sequence_start=True)
    info, total = _infer(client, "seq", 1, sequence_id=55, sequence_start=True)  # Triton: old one ends early
    assert info["start"] == [[1.0]] and total == 1
    _infer(client, "seq", 1, sequence_id=55, sequence_end=True)


def test_id_to_a_model_without_sequence_batcher_is_passed_through(client: Client) -> None:
    """Real Triton accepts it: the model sees the id and the flags."""
    x = client.input("INPUT", np.array([[1]], np.int32), "INT32")
    result = client.raw.infer("plain", [x], sequence_id=9, sequence_start=True)
    assert json.loads(result.as_numpy("OUTPUT")[0][0]) == {"cid": 9, "flags": 1}


def test_idle_sequence_is_released(client: Client) -> None:
    _infer(client, "seq_idle", 1, sequence_id=77, sequence_start=True)
    _, total = _infer(client, "seq_idle", 2, sequence_id=77)  # within 300 ms: still there
    assert total == 3
    # the passing of time is what is tested here: 300 ms without a request frees the slot and the state
    gevent.sleep(0.8)
    with pytest.raises(InferenceServerException) as e:
        _infer(client, "seq_idle", 1, sequence_id=77)
    assert "must specify the START flag" in e.value.message()
    _, total = _infer(client, "seq_idle", 1, sequence_id=77, sequence_start=True, sequence_end=True)
    assert total == 1


def test_backlog_waits_for_a_free_slot(server: ServerProcess) -> None:
    """seq_one has one instance and no batching: one slot. A second sequence waits until the first ends."""
    c, other = Client("http", server), Client("http", server)
    try:
        _infer(c, "seq_one", 1, sequence_id=1, sequence_start=True)
        waiting = gevent.spawn(_infer, other, "seq_one", 2, sequence_id=2, sequence_start=True)
        waiting.join(timeout=0.5)  # what is tested is that nothing happens: give it the time to go wrong
        assert not waiting.ready()  # no slot for it yet
        _infer(c, "seq_one", 1, sequence_id=1, sequence_end=True)
        info, _ = waiting.get(timeout=30)
        assert info["cid"] == 2 and info["start"] == [1.0]
        _infer(c, "seq_one", 1, sequence_id=2, sequence_end=True)
    finally:
        c.close()
        other.close()


def test_sequences_abandoned_in_the_backlog_do_not_wedge_the_model(server: ServerProcess) -> None:
    """One slot held by an idle sequence; four STARTs queue behind it and their clients cancel (as a
    client timeout does). When the idle sequence is released, the abandoned ones are dropped one after
    the other and a live sequence that came after them runs."""
    holder = Client("grpc", server)
    abandoning = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        _infer(holder, "seq_one_idle", 1, sequence_id=1, sequence_start=True)  # holds the slot, then idles
        x = grpcclient.InferInput("INPUT", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        calls = [abandoning.async_infer("seq_one_idle", [x], callback=lambda result, error: None,
                                        sequence_id=10 + i, sequence_start=True) for i in range(4)]
        assert abandoning.is_server_live()  # their HEADERS went first on this connection: they are queued
        for call in calls:
            call.cancel()  # RST_STREAM
        assert abandoning.is_server_live()  # the server read the cancels before answering this
        info, _ = _infer(holder, "seq_one_idle", 5, sequence_id=99, sequence_start=True, sequence_end=True,
                         client_timeout=20)  # before: never answered
        assert info["cid"] == 99 and info["start"] == [1.0]
    finally:
        holder.close()
        abandoning.close()


def test_oldest_batches_across_sequences(server: ServerProcess) -> None:
    """preferred size 2, 20 s delay: the first request waits until a second sequence's request joins it."""
    clients = [Client("http", server) for _ in range(2)]
    try:
        calls = [gevent.spawn(_infer, c, "seq_oldest", 1, sequence_id=600 + i, sequence_start=True)
                 for i, c in enumerate(clients)]
        gevent.joinall(calls, timeout=15, raise_error=True)
        assert [g.value[0]["batch"] for g in calls] == [2, 2]
        assert sorted(g.value[0]["cid"] for g in calls) == [600, 601]
        calls = [gevent.spawn(_infer, c, "seq_oldest", 2, sequence_id=600 + i, sequence_end=True)
                 for i, c in enumerate(clients)]
        gevent.joinall(calls, timeout=15, raise_error=True)
        assert [g.value[1] for g in calls] == [3, 3]  # each sequence kept its own state
    finally:
        for c in clients:
            c.close()


def _stream(server: ServerProcess) -> tuple[grpcclient.InferenceServerClient, queue.Queue]:
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put(error or result))
    return c, results


@pytest.mark.parametrize("model,seq_id", [("seq", 901), ("seq_str", "stream-s")])
def test_sequence_over_a_grpc_stream(server: ServerProcess, model: str, seq_id: int | str) -> None:
    c, results = _stream(server)
    try:
        for i, kw in enumerate(({"sequence_start": True}, {}, {"sequence_end": True})):
            x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[i + 1]], np.int32))
            c.async_stream_infer(model, [x], sequence_id=seq_id, **kw)
        answers = [results.get(timeout=30) for _ in range(3)]
        assert [int(a.as_numpy("SUM")[0][0]) for a in answers] == [1, 3, 6]
        assert json.loads(answers[2].as_numpy("OUTPUT")[0][0])["corrid"] == [seq_id]
        x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[1]], np.int32))
        c.async_stream_infer(model, [x], sequence_id=seq_id)  # ended: an error on the stream, which goes on
        error = results.get(timeout=30)
        assert isinstance(error, InferenceServerException) and "must specify the START flag" in error.message()
    finally:
        c.stop_stream()
        c.close()


def test_iterative_sequence_reschedules_one_request(server: ServerProcess) -> None:
    """Triton 2.51's iterative_sequence: one request without an id, rescheduled by the model until done;
    two of them at once get ids of their own and interleave."""
    c, results = _stream(server)
    try:
        for n in (3, 2):
            x = grpcclient.InferInput("IN", [1], "INT32")
            x.set_data_from_numpy(np.array([n], np.int32))
            c.async_stream_infer("iter", [x])
        got = [results.get(timeout=30) for _ in range(5)]
        by_id: dict[int, list[int]] = {}
        for r in got:
            assert not isinstance(r, Exception), r
            by_id.setdefault(int(r.as_numpy("CID")[0]), []).append(int(r.as_numpy("OUT")[0]))
        assert sorted(by_id.values()) == [[1, 0], [2, 1, 0]]
    finally:
        c.stop_stream()
        c.close()


def test_cancelled_iterative_request_stops_and_frees_its_slot(server: ServerProcess) -> None:
    """The model never checks is_cancelled(): the server stops rescheduling once the stream is cancelled,
    and the model's one slot (one instance, no batching) serves the next request."""
    c, results = _stream(server)
    x = grpcclient.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([10**9], np.int32))
    c.async_stream_infer("iter", [x])
    results.get(timeout=30)  # it runs
    c.stop_stream(cancel_requests=True)
    c.close()
    c, results = _stream(server)
    try:
        x.set_data_from_numpy(np.array([2], np.int32))
        c.async_stream_infer("iter", [x])
        got = [results.get(timeout=30) for _ in range(2)]
        assert [int(r.as_numpy("OUT")[0]) for r in got] == [1, 0]
    finally:
        c.stop_stream()
        c.close()


def test_iterative_sequence_in_a_plain_model(client: Client) -> None:
    """Rescheduled requests return None from execute; the client gets the one final answer."""
    x = client.input("IN", np.array([4], np.int32), "INT32")
    result = client.raw.infer("iter_plain", [x])
    assert int(result.as_numpy("OUT")[0]) == 4 and int(result.as_numpy("CID")[0]) >= 1


def test_http_sequence_id_of_a_wrong_json_type(server: ServerProcess) -> None:
    """Real Triton answers 500 with its JSON parser's words for a sequence_id that is neither uint64 nor string."""
    import urllib.request

    body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
                       "parameters": {"sequence_id": -3, "sequence_start": True}}).encode()
    req = urllib.request.Request(f"http://{server.url}/v2/models/seq/infer", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 500
    assert json.loads(e.value.read()) == {"error": "Unable to parse 'sequence_id': attempt to access JSON non-string as string"}


def test_config_json_prints_the_sequence_batcher_as_triton_does(server: ServerProcess) -> None:
    """Captured from real Triton 2.51 for the same control_input; no strategy key when none was set."""
    c = httpclient.InferenceServerClient(server.url)
    try:
        sb = c.get_model_config("seq")["sequence_batching"]
    finally:
        c.close()
    assert sb["control_input"][0] == {"name": "START", "control": [{
        "kind": "CONTROL_SEQUENCE_START", "int32_false_true": [], "fp32_false_true": [0, 1], "bool_false_true": [],
        "data_type": "TYPE_INVALID"}]}
    assert sb["iterative_sequence"] is False and "direct" not in sb and "oldest" not in sb
    assert sb["state"][0]["initial_state"][0]["dims"] == [1]


def test_the_status_page_has_live_numbers_for_a_sequence_model(client: Client, server: ServerProcess) -> None:
    """The sequence scheduler did not answer the status page's GetStatus: its models showed a state and no
    numbers (instances, queue, requests, latency)."""
    import urllib.request

    _infer(client, "seq", 1, sequence_id=909, sequence_start=True, sequence_end=True)
    with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:
        rows = {row["name"]: row for row in json.loads(answer.read())["versions"]}
    seq = rows["seq"]
    assert seq["instances"] and seq["success"] >= 1 and seq["queued"] == 0, seq

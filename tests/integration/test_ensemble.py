"""Ensembles (``platform: "ensemble"``) on a real server, driven by the official clients.

Composing models are small python models configured through their ``parameters``: ``add`` / ``mul``
(Y = X * mul + add), ``meet`` (a folder: the model writes its name there and waits for ``other`` to
write its own, so two steps only finish if they run at the same time), negative inputs are refused
with the model's own error.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from pathlib import Path

import gevent
import gevent.event
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import index, wait_for
from .server import add_model

ARITH_PY = """
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        p = {k: v["string_value"] for k, v in params.items()}
        self.add, self.mul = float(p.get("add", "0")), float(p.get("mul", "1"))
        self.meet, self.other, self.name = p.get("meet"), p.get("other"), args["model_name"]

    def execute(self, requests):
        if self.meet:
            open(os.path.join(self.meet, self.name), "w").close()
            deadline = time.time() + 20
            while not os.path.exists(os.path.join(self.meet, self.other)):
                if time.time() > deadline:
                    raise pb_utils.TritonModelException(self.other + " never ran while " + self.name + " ran")
                time.sleep(0.005)  # model code polling a file the other step writes
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(self.name + " refuses negative input")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * self.mul + self.add).astype(np.float32))]))
        return out
"""


def _arith_config(params: dict[str, str], extra: str = "") -> str:
    p = ", ".join(f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
parameters [ {p} ]
{extra}
"""


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    i = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    o = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {i} {o} }}'


def _ensemble_config(outputs: list[str], steps: list[str], extra: str = "", inputs: str = "") -> str:
    outs = ", ".join(f'{{ name: "{o}", data_type: TYPE_FP32, dims: [ 2 ] }}' for o in outputs)
    ins = inputs or '{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }'
    return f"""
platform: "ensemble"
max_batch_size: 8
input [ {ins} ]
output [ {outs} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
{extra}
"""


def add_ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)


def pipeline(repo: Path, add: str = "1") -> None:
    """ens: A = IN + add (inc), B = IN * 2 (dbl), C = A * 2 (dbl again)."""
    add_model(repo, "inc", _arith_config({"add": add}), ARITH_PY)
    add_model(repo, "dbl", _arith_config({"mul": "2"}), ARITH_PY)
    add_ensemble(repo, "ens", _ensemble_config(["A", "B", "C"], [
        _step("inc", {"X": "IN"}, {"Y": "A"}), _step("dbl", {"X": "IN"}, {"Y": "B"}), _step("dbl", {"X": "A"}, {"Y": "C"})]))


def _infer(url: str, model: str, value: float, outputs: tuple[str, ...] = ()) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    x = httpclient.InferInput("IN", [1, 2], "FP32")
    x.set_data_from_numpy(np.full((1, 2), value, np.float32))
    try:
        requested = [httpclient.InferRequestedOutput(o) for o in outputs] or None
        return client.infer(model, [x], outputs=requested)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_answers_and_counts_statistics(tmp_path: Path, start_server, protocol: str) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path)
    if protocol == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("IN", [1, 2], "FP32")
    else:
        client = httpclient.InferenceServerClient(server.url)
        x = httpclient.InferInput("IN", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1, 2]], np.float32))
    for _ in range(3):
        r = client.infer("ens", [x])
        assert r.as_numpy("A").tolist() == [[2, 3]]
        assert r.as_numpy("B").tolist() == [[2, 4]]
        assert r.as_numpy("C").tolist() == [[4, 6]]
    client.close()
    http = httpclient.InferenceServerClient(server.url)
    assert http.get_model_metadata("ens")["platform"] == "ensemble"
    stats = {s["name"]: s for s in http.get_inference_statistics()["model_stats"]}
    # Triton: the ensemble counts its requests; each composing model counts the steps it ran
    assert stats["ens"]["inference_stats"]["success"]["count"] == 3
    assert stats["ens"]["inference_count"] == 3
    assert stats["inc"]["inference_stats"]["success"]["count"] == 3
    assert stats["dbl"]["inference_stats"]["success"]["count"] == 6
    # and the ensemble's queue and compute times are the sums of its steps' (Triton's secondary aggregator)
    for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
        ens = stats["ens"]["inference_stats"][kind]
        assert ens["count"] == 3
        assert ens["ns"] == sum(stats[m]["inference_stats"][kind]["ns"] for m in ("inc", "dbl"))
    assert stats["ens"]["inference_stats"]["compute_infer"]["ns"] > 0
    assert stats["ens"]["execution_count"] == 0 and stats["ens"]["batch_stats"] == []  # it executes nothing itself
    with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:  # the status page
        status = {v["name"]: v for v in json.loads(answer.read())["versions"]}
    assert status["ens"]["state"] == "READY" and status["ens"]["instances"] == []


# a python model that hands its input to the ensemble "ens" through BLS and returns C
BLS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            answer = pb_utils.InferenceRequest(model_name="ens", requested_output_names=["C"],
                                               inputs=[pb_utils.Tensor("IN", x)]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            c = pb_utils.get_output_tensor_by_name(answer, "C").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", c)]))
        return out
"""


def test_a_python_model_calls_an_ensemble_through_bls(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    add_model(tmp_path, "caller", _arith_config({}), BLS_PY)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1, 2]], np.float32))
    assert client.infer("caller", [x]).as_numpy("Y").tolist() == [[4, 6]]
    x.set_data_from_numpy(np.array([[-1, 2]], np.float32))
    with pytest.raises(InferenceServerException) as info:  # the step's error travels back through BLS
        client.infer("caller", [x])
    assert "refuses negative input" in info.value.message()


def test_independent_branches_run_at_the_same_time(tmp_path: Path, start_server) -> None:
    meet = tmp_path / "meet"
    meet.mkdir()
    repo = tmp_path / "repo"
    add_model(repo, "left", _arith_config({"meet": str(meet), "other": "right", "add": "1"}), ARITH_PY)
    add_model(repo, "right", _arith_config({"meet": str(meet), "other": "left", "add": "2"}), ARITH_PY)
    # each branch finishes only once the other one started: a scheduler running steps one by one fails
    add_ensemble(repo, "fork", _ensemble_config(["L", "R"], [
        _step("left", {"X": "IN"}, {"Y": "L"}), _step("right", {"X": "IN"}, {"Y": "R"})]))
    server = start_server(repo)
    r = _infer(server.url, "fork", 1.0)
    assert r.as_numpy("L").tolist() == [[2, 2]] and r.as_numpy("R").tolist() == [[3, 3]]


def test_a_failing_step_fails_its_request_only(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path)
    calls = [gevent.spawn(_infer, server.url, "ens", -1.0 if i % 4 == 0 else float(i)) for i in range(24)]
    gevent.joinall(calls, timeout=60)
    for i, call in enumerate(calls):
        if i % 4 == 0:
            assert isinstance(call.exception, InferenceServerException)
            assert "refuses negative input" in call.exception.message()
        else:
            assert call.exception is None, call.exception
            assert call.value.as_numpy("C").tolist() == [[(i + 1) * 2] * 2]
    stats = {s["name"]: s for s in httpclient.InferenceServerClient(server.url).get_inference_statistics()["model_stats"]}
    assert stats["ens"]["inference_stats"]["fail"]["count"] == 6
    assert stats["ens"]["inference_stats"]["success"]["count"] == 18


def test_requested_outputs_only(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path)
    r = _infer(server.url, "ens", 1.0, outputs=("C",))
    assert r.as_numpy("C").tolist() == [[4, 4]] and r.as_numpy("A") is None


def test_broken_graphs_fail_to_load_with_tritons_texts(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    add_ensemble(tmp_path, "twice", _ensemble_config(["A"], [
        _step("inc", {"X": "IN"}, {"Y": "A"}), _step("dbl", {"X": "IN"}, {"Y": "A"})]))
    add_ensemble(tmp_path, "missing", _ensemble_config(["A"], [_step("nope", {"X": "IN"}, {"Y": "A"})]))
    int_in = '{ name: "IN", data_type: TYPE_INT32, dims: [ 2 ] }'
    add_ensemble(tmp_path, "badtype", _ensemble_config(["A"], [_step("inc", {"X": "IN"}, {"Y": "A"})], inputs=int_in))
    add_ensemble(tmp_path, "cyc_a", _ensemble_config(["A"], [_step("cyc_b", {"X": "IN"}, {"Y": "A"})]))
    add_ensemble(tmp_path, "cyc_b", _ensemble_config(["A"], [_step("cyc_a", {"X": "IN"}, {"Y": "A"})]))
    server = start_server(tmp_path, flags=("--exit-on-error=false",))
    entries = index(httpclient.InferenceServerClient(server.url))
    reasons = {name: e.get("reason", "") for (name, _), e in entries.items()}
    assert reasons["twice"].endswith("ensemble tensor 'A' can appear in an output map only once for ensemble "
                                      "'twice' step 1")
    assert reasons["missing"].endswith("ensemble missing contains models that are not available or ambiguous: nope")
    assert reasons["badtype"].endswith("in ensemble badtype, ensemble tensor IN: inconsistent data type: TYPE_INT32 "
                                       "is inferred from model badtype while TYPE_FP32 is inferred from model inc")
    assert reasons["cyc_a"] == "circular dependency between ensembles: cyc_a -> ... -> cyc_b -> cyc_a"
    assert entries[("ens", "1")]["state"] == "READY"  # the broken ones disturb nothing else
    assert _infer(server.url, "ens", 0.0).as_numpy("C").tolist() == [[2, 2]]


def test_explicit_load_of_an_ensemble_loads_what_it_needs_and_unload_dependents(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    add_ensemble(tmp_path, "missing", _ensemble_config(["A"], [_step("nope", {"X": "IN"}, {"Y": "A"})]))
    server = start_server(tmp_path, flags=("--model-control-mode=explicit",))
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens")
    assert {n for (n, _), e in index(client).items() if e.get("state") == "READY"} == {"ens", "inc", "dbl"}
    assert _infer(server.url, "ens", 0.0).as_numpy("C").tolist() == [[2, 2]]
    client.unload_model("ens")  # without unload_dependents the composing models stay
    wait_for(lambda: index(client)[("ens", "1")]["state"] == "UNAVAILABLE", what="ens unloaded")
    assert {n for (n, _), e in index(client).items() if e.get("state") == "READY"} == {"inc", "dbl"}
    client.load_model("ens")
    client.load_model("dbl")  # now loaded explicitly: it stays when ens goes with its dependents
    client.unload_model("ens", unload_dependents=True)
    wait_for(lambda: index(client)[("inc", "1")]["state"] == "UNAVAILABLE", what="inc unloaded with ens")
    assert index(client)[("dbl", "1")]["state"] == "READY"
    with pytest.raises(InferenceServerException) as info:
        client.load_model("missing")
    assert "ensemble missing contains models that are not available or ambiguous: nope" in info.value.message()


def test_reloading_a_composing_model_under_load_fails_nothing(tmp_path: Path, start_server) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path, flags=("--model-control-mode=explicit", "--load-model=ens"))
    stop = gevent.event.Event()
    seen: set[float] = set()
    failures: list[BaseException] = []

    def load() -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        x = httpclient.InferInput("IN", [1, 2], "FP32")
        x.set_data_from_numpy(np.zeros((1, 2), np.float32))
        while not stop.is_set():
            try:
                seen.add(float(client.infer("ens", [x]).as_numpy("A")[0, 0]))
            except Exception as e:  # every failure counts
                failures.append(e)
        client.close()

    workers = [gevent.spawn(load) for _ in range(4)]
    wait_for(lambda: 1.0 in seen, what="traffic before the reload")
    (tmp_path / "inc" / "config.pbtxt").write_text(_arith_config({"add": "5"}))
    httpclient.InferenceServerClient(server.url, network_timeout=120).load_model("inc")
    wait_for(lambda: 5.0 in seen, what="the reloaded model answering")
    stop.set()
    gevent.joinall(workers, timeout=60)
    assert failures == []
    assert seen == {1.0, 5.0}


# sends N responses Y = 0 .. N-1, writing to <progress>/sent how many it sent (before each send)
DECOUPLED_GEN_PY = """
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.sent = os.path.join(json.loads(args["model_config"])["parameters"]["progress"]["string_value"], "sent")

    def execute(self, requests):
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            sender = r.get_response_sender()
            for i in range(n):
                with open(self.sent + ".tmp", "w") as f:
                    f.write(str(i + 1))
                os.replace(self.sent + ".tmp", self.sent)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([i], np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            open(self.sent + ".done", "w").close()
        return None
"""

# Y = X * X; OVERLAP = 1 when another instance was busy at the same time (watched for 0.2 s);
# AHEAD = how many responses the producer had sent beyond this one when it arrived. The step for X = 0 first
# waits until the producer finished (or 2 s): a producer the server does not hold back is then 9 ahead
# whatever the machine's load (comparing a free producer's speed with the step's made the test flaky)
SLOW_SQUARE_PY = """
import json, os, time, uuid
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.dir = params["busy"]["string_value"]
        self.sent = os.path.join(params["progress"]["string_value"], "sent")

    def execute(self, requests):
        mine = os.path.join(self.dir, uuid.uuid4().hex)
        open(mine, "w").close()
        x0 = float(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0])
        deadline = time.time() + 2
        while x0 == 0 and not os.path.exists(self.sent + ".done") and time.time() < deadline:
            time.sleep(0.01)  # the first step waits for the producer (2 s at most: it may be held back)
        with open(self.sent) as f:
            sent = float(f.read())
        overlap = 0.0
        deadline = time.time() + 0.2
        while time.time() < deadline and not overlap:
            overlap = float(len(os.listdir(self.dir)) > 1)
            time.sleep(0.01)  # model code: a 0.2 s watch window
        os.remove(mine)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * x),
                                                   pb_utils.Tensor("OVERLAP", np.array([overlap], np.float32)),
                                                   pb_utils.Tensor("AHEAD", sent - x - 1)]))
        return out
"""


def _decoupled_repo(repo: Path, max_inflight: int) -> None:
    busy, progress = repo.parent / "busy", repo.parent / "progress"
    busy.mkdir(exist_ok=True)
    progress.mkdir(exist_ok=True)
    add_model(repo, "gen", f"""
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }} ]
parameters [ {{ key: "progress" value: {{ string_value: "{progress}" }} }} ]
""", DECOUPLED_GEN_PY)
    add_model(repo, "square", f"""
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }}, {{ name: "OVERLAP", data_type: TYPE_FP32, dims: [ 1 ] }},
         {{ name: "AHEAD", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
parameters [ {{ key: "busy" value: {{ string_value: "{busy}" }} }},
             {{ key: "progress" value: {{ string_value: "{progress}" }} }} ]
""", SLOW_SQUARE_PY)
    add_ensemble(repo, "stream", f"""
platform: "ensemble"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }}, {{ name: "OVERLAP", data_type: TYPE_FP32, dims: [ 1 ] }},
         {{ name: "AHEAD", data_type: TYPE_FP32, dims: [ 1 ] }} ]
ensemble_scheduling {{
  max_inflight_requests: {max_inflight}
  step [ {_step("gen", {"N": "N"}, {"Y": "mid"})},
         {_step("square", {"X": "mid"}, {"Y": "OUT", "OVERLAP": "OVERLAP", "AHEAD": "AHEAD"})} ] }}
""")


def _stream(server, n: int, finals: list[bool] | None = None) -> list[tuple[float, float, float]]:
    """One request on a gRPC stream; (OUT, OVERLAP, AHEAD) of every response, sorted; ``finals``: each
    response's final flag, in order."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    x = grpcclient.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], np.int32))
    client.async_stream_infer("stream", [x], enable_empty_final_response=True)
    out = []
    with gevent.Timeout(60):
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if finals is not None:
                finals.append(final)
            if result.as_numpy("OUT") is not None:
                out.append((float(result.as_numpy("OUT")[0]), float(result.as_numpy("OVERLAP")[0]),
                            float(result.as_numpy("AHEAD")[0])))
            if final:
                break
    client.stop_stream()
    client.close()
    return sorted(out)


def test_a_decoupled_ensemble_streams_over_grpc_and_generate_stream(tmp_path: Path, start_server) -> None:
    _decoupled_repo(tmp_path / "repo", max_inflight=0)
    server = start_server(tmp_path / "repo")
    results = _stream(server, 10)
    assert [r[0] for r in results] == [float(i * i) for i in range(10)]
    assert any(r[1] for r in results)  # without max_inflight_requests the two instances overlap
    assert max(r[2] for r in results) >= 5  # and the producer runs ahead of the slow step
    body = json.dumps({"N": 3}).encode()
    req = urllib.request.Request(f"http://{server.url}/v2/models/stream/generate_stream", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(c[len("data: "):]) for c in r.read().decode().split("\n\n") if c]
    assert sorted(e["OUT"][0] if isinstance(e["OUT"], list) else e["OUT"] for e in events) == [0.0, 1.0, 4.0]
    with pytest.raises(InferenceServerException) as info:  # /infer refuses a decoupled ensemble, as Triton does
        httpclient.InferenceServerClient(server.url).infer("stream", [_n_input(1)])
    assert "decoupled" in info.value.message()


def test_the_last_response_of_a_decoupled_ensemble_carries_the_final_flag(tmp_path: Path, start_server) -> None:
    """Triton's ensemble sends the final flag with a response when no step is in flight any more (its
    L0_simple_ensemble backpressure clients wait for it and ask for no empty final response): with one
    response, its step for X = 0 runs after the producer finished, so it is the one final response."""
    _decoupled_repo(tmp_path / "repo", max_inflight=0)
    server = start_server(tmp_path / "repo")
    finals: list[bool] = []
    assert [r[0] for r in _stream(server, 1, finals)] == [0.0]
    assert finals == [True]  # one response: the data and the flag, no empty final after it


def _n_input(n: int) -> httpclient.InferInput:
    x = httpclient.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], np.int32))
    return x


def test_max_inflight_requests_holds_back_a_fast_producer(tmp_path: Path, start_server) -> None:
    _decoupled_repo(tmp_path / "repo", max_inflight=1)
    server = start_server(tmp_path / "repo")
    assert "Ensemble model 'stream' configured with max_inflight_requests: 1" in server.log()  # Triton's line
    results = _stream(server, 10)
    assert [r[0] for r in results] == [float(i * i) for i in range(10)]
    assert not any(r[1] for r in results)  # one step request in flight at a time: never two instances busy
    # the producer waits too: one response in the slow step, one taken by the ensemble, one queued, one
    # being sent
    assert max(r[2] for r in results) <= 3, results



def test_ensemble_traffic_goes_through_the_composing_models_dynamic_batcher(tmp_path: Path, start_server) -> None:
    # the batcher holds requests until four are queued (or 30 s pass): four ensemble requests make one batch
    batching = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"
    add_model(tmp_path, "inc", _arith_config({"add": "1"}, extra=batching), ARITH_PY)
    add_ensemble(tmp_path, "one", _ensemble_config(["A"], [_step("inc", {"X": "IN"}, {"Y": "A"})]))
    server = start_server(tmp_path)
    calls = [gevent.spawn(_infer, server.url, "one", float(i)) for i in range(4)]
    gevent.joinall(calls, timeout=60, raise_error=True)
    assert sorted(c.value.as_numpy("A")[0, 0] for c in calls) == [1.0, 2.0, 3.0, 4.0]
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("inc")["model_stats"][0]
    assert [b["batch_size"] for b in stats["batch_stats"]] == [4]
    assert stats["execution_count"] == 1


def test_poll_loads_an_ensemble_after_the_models_it_needs(tmp_path: Path, start_server) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    repo.mkdir()
    pipeline(staging)
    server = start_server(repo, flags=("--model-control-mode=poll", "--repository-poll-secs=1"))
    for name in ("ens", "dbl", "inc"):  # the ensemble appears first; all three settle in one rescan
        (staging / name).rename(repo / name)

    def answers() -> bool:
        try:
            return _infer(server.url, "ens", 0.0).as_numpy("C").tolist() == [[2, 2]]
        except InferenceServerException:
            return False

    wait_for(answers, 30, "the ensemble to serve")


JOIN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
                                                           + pb_utils.get_input_tensor_by_name(r, "B").as_numpy())])
                for r in requests]
"""


def test_a_step_joining_a_stream_with_a_plain_branch_is_refused(tmp_path: Path, start_server) -> None:
    """join reads gen's stream and late's single answer: Triton cannot pair them and refuses the
    ensemble at load with this text (checked on Triton 2.51; repository/ensemble_graph.py)."""
    repo = tmp_path / "repo"
    _decoupled_repo(repo, max_inflight=0)
    add_model(repo, "late", """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "B", data_type: TYPE_FP32, dims: [ 1 ] } ]
""", "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    add_model(repo, "join", """
backend: "python"
max_batch_size: 0
input [ { name: "A", data_type: TYPE_FP32, dims: [ 1 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
""", JOIN_PY)
    add_ensemble(repo, "joined", f"""
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }}, {{ name: "NF", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
ensemble_scheduling {{ step [
  {_step("gen", {"N": "N"}, {"Y": "y"})},
  {_step("late", {"X": "NF"}, {"B": "b"})},
  {_step("join", {"A": "y", "B": "b"}, {"OUT": "OUT"})} ] }}
""")
    server = start_server(repo, flags=("--exit-on-error=false",))
    entry = {e["name"]: e for e in httpclient.InferenceServerClient(server.url).get_model_repository_index()}["joined"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == ("Invalid argument: in ensemble joined, step of model 'joined' receives inputs originated from different "
                               "decoupled models")


def _stream_n(server, model: str, n: int) -> list[grpcclient.InferResult]:
    """One request (N) on a gRPC stream; every response that has OUT."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    n_input = grpcclient.InferInput("N", [1], "INT32")
    n_input.set_data_from_numpy(np.array([n], np.int32))
    client.async_stream_infer(model, [n_input], enable_empty_final_response=True)
    results = []
    try:
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error.message()
            if result.as_numpy("OUT") is not None:
                results.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:  # with the last one, or alone
                return results
    finally:
        client.stop_stream()
        client.close()


def test_a_very_wide_ensemble(tmp_path: Path, start_server) -> None:
    """2000 steps that all read the ensemble input start a few dozen per hub turn (the hub stays free
    for other requests meanwhile: scripts/bench_wide_ensemble.py measures it); every output arrives."""
    add_model(tmp_path, "ident", _arith_config({}), ARITH_PY)
    names = [f"O{i}" for i in range(2000)]
    add_ensemble(tmp_path, "wide", _ensemble_config(names, [_step("ident", {"X": "IN"}, {"Y": o}) for o in names]))
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = httpclient.InferInput("IN", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, 2.0]], np.float32))
    try:
        jobs = [gevent.spawn(client.infer, "wide", [x]) for _ in range(3)]  # three at once share the turns
        gevent.joinall(jobs, timeout=120, raise_error=True)
        for job in jobs:
            assert all(job.value.as_numpy(o).tolist() == [[1.5, 2.0]] for o in names)
        assert client.is_server_ready()
    finally:
        client.close()


IDENT1_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_a_wide_fan_out_after_a_decoupled_step(tmp_path: Path, start_server) -> None:
    """gen (step 0) streams Y = 0, 1, 2; each response's fork starts 300 plain steps on it, a few dozen
    per hub turn, and join OUT = Y + P299 once per response with every P of that fork (the unit tests
    in test_ensemble_scheduler.py pin the order of events). Every tensor comes from gen's stream:
    Triton refuses a step or output set that mixes a stream with a plain branch."""
    repo = tmp_path / "repo"
    _decoupled_repo(repo, max_inflight=0)
    add_model(repo, "ident1", """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
""", IDENT1_PY)
    add_model(repo, "join", """
backend: "python"
max_batch_size: 0
input [ { name: "A", data_type: TYPE_FP32, dims: [ 1 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
""", JOIN_PY)
    wide = [f"P{i}" for i in range(300)]
    outs = ", ".join(f'{{ name: "{o}", data_type: TYPE_FP32, dims: [ 1 ] }}' for o in ["OUT", *wide[:-1]])
    add_ensemble(repo, "fan", f"""
platform: "ensemble"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {outs} ]
ensemble_scheduling {{ step [
  {_step("gen", {"N": "N"}, {"Y": "y"})},
  {", ".join(_step("ident1", {"X": "y"}, {"Y": p}) for p in wide)},
  {_step("join", {"A": "y", "B": wide[-1]}, {"OUT": "OUT"})} ] }}
""")
    server = start_server(repo)
    answers = [(float(r.as_numpy("OUT")[0]), {float(r.as_numpy(p)[0]) for p in wide[:-1]})
               for r in _stream_n(server, "fan", 3)]
    assert sorted(a[0] for a in answers) == [0.0, 2.0, 4.0]
    assert all(a[1] == {a[0] / 2} for a in answers)


def _shape_chain(repo: Path) -> None:
    """chain: IN → ``any`` (passes on whatever length it gets) → ``two`` (takes only [2]) → OUT."""
    for name, dims in (("any", "-1"), ("two", "2")):
        add_model(repo, name, f"""
backend: "python"
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ {dims} ] }} ]
""", ARITH_PY)
    add_ensemble(repo, "chain", """
platform: "ensemble"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "any" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "T" } },
  { model_name: "two" model_version: -1 input_map { key: "X" value: "T" } output_map { key: "Y" value: "OUT" } }
] }
""")


def test_a_step_refused_by_its_model_stays_refused(tmp_path: Path, start_server) -> None:
    """A step's request is checked against its model's config as any request is (the fast path
    remembers the input shapes a step's model accepted, never one it refused), with both models
    running inline by then."""
    _shape_chain(tmp_path)
    server = start_server(tmp_path)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)

    def ask(n: int) -> httpclient.InferResult:
        x = httpclient.InferInput("IN", [n], "FP32")
        x.set_data_from_numpy(np.arange(n, dtype=np.float32))
        return client.infer("chain", [x])

    for _ in range(40):  # past the inline promotion (32 short runs)
        assert ask(2).as_numpy("OUT").tolist() == [0.0, 1.0]
    for _ in range(2):
        with pytest.raises(InferenceServerException) as e:
            ask(3)
        assert "unexpected shape for input 'X' for model 'two'. Expected [2], got [3]" in e.value.message()
    assert ask(2).as_numpy("OUT").tolist() == [0.0, 1.0]
    client.close()


def test_steps_that_batch_and_steps_that_do_not_meet_in_one_ensemble(tmp_path: Path, start_server) -> None:
    """Triton core's ReshapeTensorDims (its L0_simple_ensemble backpressure models: an ensemble that does not
    batch feeds a model with max_batch_size 1): a batching step gets the tensor with a batch of 1 in front,
    a step that does not batch gets a batched tensor of batch 1 without it."""
    repo = tmp_path / "repo"
    add_model(repo, "inc", _arith_config({"add": "1"}), ARITH_PY)  # batches (max_batch_size 8), dims [2]
    add_model(repo, "flat", _arith_config({"mul": "3"}).replace("max_batch_size: 8", "max_batch_size: 0"), ARITH_PY)
    no_batch = _ensemble_config(["A", "B"], [_step("inc", {"X": "IN"}, {"Y": "A"}), _step("flat", {"X": "A"}, {"Y": "B"})])
    add_ensemble(repo, "plain", no_batch.replace("max_batch_size: 8", "max_batch_size: 0"))
    add_ensemble(repo, "batched", _ensemble_config(["B"], [_step("flat", {"X": "IN"}, {"Y": "F"}),
                                                          _step("inc", {"X": "F"}, {"Y": "B"})]))
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("IN", [2], "FP32")  # no batch dimension: the ensemble does not batch
    x.set_data_from_numpy(np.array([1, 2], np.float32))
    result = client.infer("plain", [x])
    np.testing.assert_array_equal(result.as_numpy("A").ravel(), [2, 3])  # (its shape: see docs/compatibility.md)
    np.testing.assert_array_equal(result.as_numpy("B"), [6, 9])  # flat took it as [2]
    x = httpclient.InferInput("IN", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1, 2]], np.float32))
    np.testing.assert_array_equal(client.infer("batched", [x]).as_numpy("B"), [[4, 7]])


PARTIAL_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):  # Z is in the config, and left out of every response
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


@pytest.mark.parametrize("chain", [True, False])
def test_an_output_a_step_leaves_out_is_left_out_of_the_answer(tmp_path: Path, start_server, chain: bool) -> None:
    """Triton's L0_simple_ensemble partial_add_sub: a step's model answers without one of its outputs; the
    ensemble answers with the others and logs (verbose) "Composing models did not output tensor B"."""
    repo = tmp_path / "repo"
    add_model(repo, "partial", _arith_config({}).replace(
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]',
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }, { name: "Z", data_type: TYPE_FP32, dims: [ 2 ] } ]'),
        PARTIAL_PY)
    add_model(repo, "inc", _arith_config({"add": "1"}), ARITH_PY)
    steps = [_step("partial", {"X": "IN"}, {"Y": "A", "Z": "B"})]
    if not chain:  # a second branch beside it: the data flow, not the chain loop
        steps.append(_step("inc", {"X": "IN"}, {"Y": "C"}))
    add_ensemble(repo, "ens", _ensemble_config(["A", "B", *([] if chain else ["C"])], steps))
    server = start_server(repo, flags=("--log-verbose=1",))
    result = _infer(server.url, "ens", 3.0)
    np.testing.assert_array_equal(result.as_numpy("A"), [[3, 3]])
    assert result.as_numpy("B") is None
    assert server.stderr.wait(lambda: "Composing models did not output tensor B" in server.log(), 30)

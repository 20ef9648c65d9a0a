"""The response cache through a real server and the official clients: ``--cache-config local,size=N``
and ``redis,host=H`` + ``redis,port=P`` against a real ``redis-server`` this test starts; Triton's
statistics (``cache_hit``/``cache_miss``), ``nv_cache_*`` families, LRU eviction by bytes, the
decoupled refusal, a model that enables the cache on a server without one, and a Redis that goes away."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import requests

from .clients import PROTOCOLS, Client
from .server import IDENTITY_PY, ServerProcess, add_model

Start = Callable[..., ServerProcess]

CACHED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
response_cache { enable: true }
"""

DECOUPLED_CONFIG = CACHED_CONFIG + "model_transaction_policy { decoupled: true }\n"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    add_model(repo, "cached", CACHED_CONFIG, IDENTITY_PY)
    return repo


def _infer(client: Client, values: np.ndarray) -> np.ndarray:
    x = client.mod.InferInput("INPUT0", list(values.shape), "FP32")
    x.set_data_from_numpy(values)
    return client.infer("cached", [x]).as_numpy("OUTPUT0")


def _stats(server: ServerProcess) -> dict:
    body = requests.get(f"http://{server.url}/v2/models/cached/stats", timeout=30).json()
    s = body["model_stats"][0]
    return {"exec": s["execution_count"], "inferences": s["inference_count"],
            "hit": s["inference_stats"]["cache_hit"]["count"], "miss": s["inference_stats"]["cache_miss"]["count"],
            "success": s["inference_stats"]["success"]["count"]}


def _metric(server: ServerProcess, family: str, labels: str = '{model="cached",version="1"}') -> float:
    text = requests.get(server.metrics_url, timeout=30).text
    m = re.search(rf'^{family}{re.escape(labels)} (\S+)$', text, re.M)
    assert m is not None, f"{family} missing"
    return float(m.group(1))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.timeout(120)
def test_second_identical_request_is_a_hit(tmp_path: Path, start_server: Start, protocol: str) -> None:
    server = start_server(_repo(tmp_path), flags=("--cache-config", "local,size=1048576",
                                                  "--metrics-config", "summary_latencies=true"))
    client = Client(protocol, server)
    try:
        a = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(_infer(client, a), a)
        assert _stats(server) == {"exec": 1, "inferences": 1, "hit": 0, "miss": 1, "success": 1}
        np.testing.assert_array_equal(_infer(client, a), a)  # from the cache: the model does not run
        assert _stats(server) == {"exec": 1, "inferences": 1, "hit": 1, "miss": 1, "success": 2}
        b = a + 1  # other bytes: a miss
        np.testing.assert_array_equal(_infer(client, b), b)
        assert _stats(server) == {"exec": 2, "inferences": 2, "hit": 1, "miss": 2, "success": 3}
        assert _metric(server, "nv_cache_num_hits_per_model") == 1
        assert _metric(server, "nv_cache_num_misses_per_model") == 2
        assert _metric(server, "nv_inference_count") == 2  # hits are not inferences (Triton's help text)
        gauges = {f: _metric(server, f, "") for f in ("nv_cache_num_entries", "nv_cache_num_lookups",
                                                       "nv_cache_num_hits", "nv_cache_num_misses")}
        assert gauges == {"nv_cache_num_entries": 2, "nv_cache_num_lookups": 3, "nv_cache_num_hits": 1,
                          "nv_cache_num_misses": 2}
        assert 0 < _metric(server, "nv_cache_util", "") < 1
        assert _metric(server, "nv_cache_hit_summary_per_model_count") == 1
        assert _metric(server, "nv_cache_miss_summary_per_model_count") == 2
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_lru_eviction_by_bytes(tmp_path: Path, start_server: Start) -> None:
    # 2000 FP32 = 8000 bytes an entry: a 12000-byte cache holds one
    server = start_server(_repo(tmp_path), flags=("--cache-config=local,size=12000",))
    client = Client("http", server)
    try:
        a, b = np.zeros(2000, np.float32), np.ones(2000, np.float32)
        _infer(client, a)
        _infer(client, b)  # evicts a
        _infer(client, b)  # hit
        assert _stats(server)["hit"] == 1
        _infer(client, a)  # evicted: runs again
        assert _stats(server) == {"exec": 3, "inferences": 3, "hit": 1, "miss": 3, "success": 4}
        assert _metric(server, "nv_cache_num_evictions", "") == 2 and _metric(server, "nv_cache_num_entries", "") == 1
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_decoupled_model_with_cache_is_refused(tmp_path: Path, start_server: Start) -> None:
    repo = _repo(tmp_path)
    add_model(repo, "streamer", DECOUPLED_CONFIG, IDENTITY_PY)
    server = start_server(repo, flags=("--cache-config", "local,size=1048576", "--exit-on-error=false"))
    index = requests.post(f"http://{server.url}/v2/repository/index", json={}, timeout=30).json()
    reason = next(m for m in index if m["name"] == "streamer")["reason"]
    assert ("Response Cache does not currently support model streamer with 'decoupled' transaction policy. "
            "Please disable the response cache.") in reason


@pytest.mark.timeout(120)
def test_model_enabling_the_cache_on_a_server_without_one_runs_every_request(tmp_path: Path, start_server: Start) -> None:
    server = start_server(_repo(tmp_path))
    client = Client("http", server)
    try:
        a = np.arange(4, dtype=np.float32)
        _infer(client, a)
        _infer(client, a)
        assert _stats(server) == {"exec": 2, "inferences": 2, "hit": 0, "miss": 0, "success": 2}
        text = requests.get(server.metrics_url, timeout=30).text
        assert "nv_cache_num_hits_per_model" not in text
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(folder: Path, *flags: str) -> tuple[int, subprocess.Popen]:
    """A real redis-server on a free port (plain, or TLS with ``flags``), once it accepts connections."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: run scripts/install_test_deps.sh"
    port = _free_port()
    listen = ["--port", "0", "--tls-port", str(port)] if flags else ["--port", str(port)]
    proc = subprocess.Popen([binary, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder), *flags], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # its log says when it accepts connections
        if "Ready to accept connections" in line:
            break
    return port, proc


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen]]:
    port, proc = _start_redis(tmp_path)
    yield port, proc
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_redis_cache_hits_and_survives_redis_going_away(tmp_path: Path, start_server: Start,
                                                         redis_server: tuple[int, subprocess.Popen]) -> None:
    port, proc = redis_server
    server = start_server(_repo(tmp_path), flags=("--cache-config", "redis,host=127.0.0.1",
                                                  "--cache-config", f"redis,port={port}"))
    client = Client("grpc", server)
    try:
        a = np.arange(6, dtype=np.float32)
        _infer(client, a)
        np.testing.assert_array_equal(_infer(client, a), a)
        assert _stats(server) == {"exec": 1, "inferences": 1, "hit": 1, "miss": 1, "success": 2}
        grpc_stats = client.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
        assert (int(grpc_stats["cache_hit"]["count"]), int(grpc_stats["cache_miss"]["count"])) == (1, 1)
        assert int(grpc_stats["cache_hit"]["ns"]) > 0 and int(grpc_stats["cache_miss"]["ns"]) > 0
        proc.kill()
        proc.wait(timeout=30)
        for _ in range(3):  # every request runs its model; none fails
            np.testing.assert_array_equal(_infer(client, a), a)
        assert _stats(server)["exec"] == 4
        assert server.log().count("redis cache at") == 1, server.log()
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_redis_that_does_not_answer_at_start_stops_the_server(tmp_path: Path, start_server: Start) -> None:
    server = start_server(_repo(tmp_path), flags=("--cache-config", f"redis,host=127.0.0.1,port={_free_port()}"),
                          wait=False)
    assert server.wait_exit() == 1
    assert "Failed to initialize RedisCache" in server.log()


ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "cached", model_version: -1,
  input_map {{ key: "INPUT0", value: "IN" }}, output_map {{ key: "OUTPUT0", value: "OUT" }} }} ] }}
{extra}
"""


def _model_stats(server: ServerProcess, name: str) -> tuple[int, int, int]:
    s = requests.get(f"http://{server.url}/v2/models/{name}/stats", timeout=30).json()["model_stats"][0]
    return s["inference_stats"]["cache_hit"]["count"], s["inference_stats"]["cache_miss"]["count"], s["execution_count"]


@pytest.mark.timeout(120)
def test_ensembles_cached_at_the_top_and_per_composing_model(tmp_path: Path, start_server: Start) -> None:
    repo = _repo(tmp_path)
    for name, extra in (("top", "response_cache { enable: true }"), ("plain", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(extra=extra))
    server = start_server(repo, flags=("--cache-config", "local,size=1048576"))
    client = Client("http", server)
    try:
        a = np.arange(3, dtype=np.float32)

        def ask(model: str) -> None:
            x = client.mod.InferInput("IN", [3], "FP32")
            x.set_data_from_numpy(a)
            np.testing.assert_array_equal(client.infer(model, [x]).as_numpy("OUT"), a)

        ask("top")
        assert (_model_stats(server, "top")[:2], _model_stats(server, "cached")) == ((0, 1), (0, 1, 1))
        ask("top")  # the ensemble's own entry: the composing model is not reached
        assert (_model_stats(server, "top")[:2], _model_stats(server, "cached")) == ((1, 1), (0, 1, 1))
        ask("plain")  # an ensemble without the cache: its step hits the composing model's entry
        assert _model_stats(server, "cached") == (1, 1, 1)
    finally:
        client.close()


@pytest.mark.timeout(240)
def test_with_workers_local_is_per_worker_and_redis_is_shared(tmp_path: Path,
                                                              redis_server: tuple[int, subprocess.Popen]) -> None:
    """The pid model answers with the pid of the worker that ran it: with a local cache each worker keeps
    its own answer (both pids come back); with Redis the first answer is every worker's (one pid)."""
    from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pid_infer, pids_seen

    repo = tmp_path / "repo"
    add_model(repo, "pid", PID_CONFIG + "response_cache { enable: true }\n", PID_PY)
    port, _proc = redis_server
    for flags, shared in ((("--cache-config", "local,size=1048576"), False),
                          (("--cache-config", f"redis,host=127.0.0.1,port={port}"), True)):
        g = Gunicorn("--model-repository", str(repo), *flags, workers=2)
        try:
            workers = set(g.wait_serving(2))
            first = pid_infer(g.url)  # stored before the others ask (misses at the same time all run)
            seen = pids_seen(g.url, workers, tries=400)
            assert first in seen
            assert len(seen) == (1 if shared else 2), (flags, seen, workers)
            assert seen <= workers
        finally:
            g.stop()


@pytest.mark.timeout(120)
def test_redis_over_tls_with_triton_keys(tmp_path: Path, start_server: Start, pki: Path) -> None:
    """cert, key and cacert (Triton's redis_cache keys) reach a redis-server that requires client certificates."""
    port, proc = _start_redis(tmp_path, "--tls-cert-file", str(pki / "server.pem"), "--tls-key-file",
                              str(pki / "server.key"), "--tls-ca-cert-file", str(pki / "ca.pem"))
    try:
        server = start_server(_repo(tmp_path), flags=(
            "--cache-config", f"redis,host=127.0.0.1,port={port}", "--cache-config", f"redis,cert={pki / 'client.pem'}",
            "--cache-config", f"redis,key={pki / 'client.key'}", "--cache-config", f"redis,cacert={pki / 'ca.pem'}"))
        client = Client("http", server)
        try:
            a = np.arange(5, dtype=np.float32)
            _infer(client, a)
            np.testing.assert_array_equal(_infer(client, a), a)
            assert _stats(server)["hit"] == 1
        finally:
            client.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)


TWO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "SAME", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "TWICE", data_type: TYPE_FP32, dims: [ -1 ] } ]
response_cache { enable: true }
"""

TWO_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAME", x), pb_utils.Tensor("TWICE", x * 2)]))
        return out
"""


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.timeout(120)
def test_each_hit_answers_with_its_own_request_id_and_outputs(tmp_path: Path, start_server: Start, protocol: str) -> None:
    """Hits answered from bytes kept per cache entry (frontends/cached_answers.py) carry the id of the
    request they answer, never the one before, and the outputs and encoding that request asked for."""
    repo = tmp_path / "repo"
    add_model(repo, "two", TWO_CONFIG, TWO_PY)
    server = start_server(repo, flags=("--cache-config", "local,size=1048576"))
    client = Client(protocol, server)
    a = np.arange(5, dtype=np.float32)
    # (id, requested outputs as (name, binary) or None for all, a hit?)
    plan = [("first", None, False), ("second", None, True), ("", None, True), ("first", None, True),
            ('q"uote\\é', None, True), ("x", [("SAME", False)], False), ("y", [("SAME", True)], True),
            ("", [("SAME", False)], True), ("z" * 300, [("SAME", False)], True)]
    try:
        for rid, outputs, _ in [*plan, *plan]:  # the second time all hits (HTTP: by their bodies' bytes)
            x = client.mod.InferInput("IN", [5], "FP32")
            x.set_data_from_numpy(a)
            wanted = None if outputs is None else [
                client.mod.InferRequestedOutput(n) if client.grpc else client.mod.InferRequestedOutput(n, binary_data=b)
                for n, b in outputs]
            result = client.infer("two", [x], request_id=rid, outputs=wanted)
            answered = result.get_response()
            assert (answered.id if client.grpc else answered.get("id", "")) == rid
            np.testing.assert_array_equal(result.as_numpy("SAME"), a)
            if outputs is None:
                np.testing.assert_array_equal(result.as_numpy("TWICE"), a * 2)
            else:
                assert result.as_numpy("TWICE") is None
                if not client.grpc:  # binary or JSON data as this request asked, whatever the kept entry saw first
                    assert ("data" in answered["outputs"][0]) is not outputs[0][1]
        hits = sum(hit for *_, hit in plan) + len(plan)
        if not client.grpc:  # a kept answer compressed as the client asks
            x = client.mod.InferInput("IN", [5], "FP32")
            x.set_data_from_numpy(a)
            result = client.infer("two", [x], request_id="first", response_compression_algorithm="gzip")
            assert result.get_response()["id"] == "first"
            np.testing.assert_array_equal(result.as_numpy("TWICE"), a * 2)
            hits += 1
        assert _model_stats(server, "two") == (hits, len(plan) - sum(hit for *_, hit in plan), 2)
        assert _metric(server, "nv_cache_num_hits", "") == hits
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.timeout(120)
def test_a_repeated_body_never_answers_from_a_stale_entry(tmp_path: Path, start_server: Start, protocol: str) -> None:
    """Bodies (HTTP) and ModelInferRequest bytes but for the id (gRPC) answered from the cache before are
    answered again by their bytes (fast path): not once their entry is evicted, and never for an input
    read from shared memory, whose bytes change under the same body."""
    import tritonclient.utils.shared_memory as shm

    server = start_server(_repo(tmp_path), flags=("--cache-config=local,size=24000", "--allow-client-shm=true"))
    client = Client(protocol, server)
    region = shm.create_shared_memory_region("in", f"/cache_{tmp_path.name}", 8000)
    try:
        a, b = np.zeros(2000, np.float32), np.ones(4000, np.float32)
        for _ in range(3):
            _infer(client, a)  # a miss, then hits; the last one by its body
        assert _stats(server)["exec"] == 1
        _infer(client, b)  # evicts a: 24000 bytes hold a's 8000 (and its kept answer's), or b's 16000, not both
        np.testing.assert_array_equal(_infer(client, a), a)  # not answered from the evicted entry: runs again
        assert _stats(server)["exec"] == 3

        client.register_system_shared_memory("in", f"/cache_{tmp_path.name}", 8000)

        def from_region(values: np.ndarray) -> np.ndarray:
            shm.set_shared_memory_region(region, [values])
            x = client.mod.InferInput("INPUT0", [2000], "FP32")
            x.set_shared_memory("in", 8000)
            return client.infer("cached", [x]).as_numpy("OUTPUT0")

        for _ in range(3):
            np.testing.assert_array_equal(from_region(a + 1), a + 1)  # the same body each time
        c = np.full(2000, 7, np.float32)
        np.testing.assert_array_equal(from_region(c), c)  # same body, other bytes in the region
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
        client.close()


@pytest.mark.timeout(120)
def test_repeated_json_bodies_answer_with_their_own_data_and_id(tmp_path: Path, start_server: Start) -> None:
    """Plain V2 JSON requests (data in the text, no binary part) repeated as a JSON client repeats them:
    each answered with its own id and data, a hit after the first of each input, JSON outputs as asked,
    whether the answer came from the decoded request or, after, from the body's bytes."""
    server = start_server(_repo(tmp_path), flags=("--cache-config", "local,size=1048576"))
    url = f"http://{server.url}/v2/models/cached/infer"

    def body(rid: str, values: list[float], binary: bool = False) -> bytes:
        return orjson.dumps({"id": rid, "inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32",
                                                    "data": values}],
                             **({"parameters": {"binary_data_output": True}} if binary else {})})

    for _ in range(3):
        for rid, values in (("a", [1.0, 2.0]), ("b", [1.0, 2.0]), ("", [3.5])):
            answer = requests.post(url, data=body(rid, values), timeout=30)
            assert answer.status_code == 200, answer.text
            got = answer.json()
            assert got.get("id", "") == rid and got["outputs"][0]["data"] == values
    binary = requests.post(url, data=body("c", [3.5], binary=True), timeout=30)
    head = int(binary.headers["Inference-Header-Content-Length"])
    assert orjson.loads(binary.content[:head])["id"] == "c"
    assert np.frombuffer(binary.content[head:], np.float32).tolist() == [3.5]
    assert _stats(server)["exec"] == 2 and _stats(server)["hit"] == 8 and _stats(server)["miss"] == 2

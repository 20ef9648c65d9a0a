"""Several worker processes under a real gunicorn arbiter: a client cannot tell it talks to N processes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from scripts import modelgen

from .clients import register_until_refused
from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pid_infer, pids_seen, wait_gone
from .server import add_model

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path / "repo", "pid", PID_CONFIG, PID_PY)
    return tmp_path / "repo"


def _stats(url: str, model: str) -> dict:
    client = httpclient.InferenceServerClient(url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def test_requests_spread_and_statistics_are_summed(repo: Path) -> None:
    g = Gunicorn("--model-repository", str(repo), workers=2)
    try:
        workers = set(g.wait_serving(2))
        seen = pids_seen(g.url, workers)
        assert seen == workers, f"answers came from {seen}, workers are {workers}"
        before = _stats(g.url, "pid")["inference_count"]
        for _ in range(30):
            pid_infer(g.url)  # fresh connections: both workers run some of them
        after = [_stats(g.url, "pid")["inference_count"] for _ in range(6)]
        assert after == [before + 30] * 6, after  # any worker answers with the host's total
        grpc = grpcclient.InferenceServerClient(g.grpc_url)
        stats = grpc.get_inference_statistics("pid", as_json=True)["model_stats"][0]
        assert int(stats["inference_count"]) == before + 30
        assert int(stats["inference_stats"]["success"]["count"]) == before + 30
    finally:
        assert g.stop() == 0


def test_shared_memory_regions_are_bounded_in_every_worker(repo: Path) -> None:
    """Registrations reach every worker, each holding a descriptor per region: a client registering
    regions is refused, with Triton's shape, while every worker still has descriptors to serve with."""
    open_files = 256
    keys = [f"/ta_workers_{os.getpid()}_{i}" for i in range(open_files + 44)]
    objects = [shm.create_shared_memory_region(f"o{i}", key, 64) for i, key in enumerate(keys)]
    g = Gunicorn("--model-repository", str(repo), "--allow-client-shm=true", workers=2, open_files=open_files)
    client = None
    try:
        workers = set(g.wait_serving(2))
        client = httpclient.InferenceServerClient(g.url, network_timeout=30)
        registered, refused = register_until_refused(client, keys)
        assert refused.status() == "400" and "failed to register shared memory region" in refused.message()
        assert 0 < registered <= open_files // 8
        for pid in workers:
            assert len(os.listdir(f"/proc/{pid}/fd")) < open_files // 2, pid
        assert pids_seen(g.url, workers) == workers  # every worker still serves fresh connections
        for _ in range(6):  # and every worker holds the same regions
            fresh = httpclient.InferenceServerClient(g.url)
            assert len(fresh.get_system_shared_memory_status()) == registered
            fresh.close()
    finally:
        if client is not None:
            client.close()
        assert g.stop() == 0
        for handle in objects:
            shm.destroy_shared_memory_region(handle)


def test_explicit_load_reaches_every_worker_and_a_worker_that_fails_undoes_it(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "fail_in_pid"
    add_model(repo, "picky", PID_CONFIG, PID_PY.replace(
        "class TritonPythonModel:",
        f"class TritonPythonModel:\n    def initialize(self, args):\n"
        f"        if open({str(marker)!r}).read().strip() == str(os.getpid()):\n"
        f"            raise RuntimeError('this worker cannot load picky')\n"))
    marker.write_text("0")
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "pid", workers=2)
    try:
        workers = set(g.wait_serving(2))
        client = httpclient.InferenceServerClient(g.url)
        marker.write_text(str(min(workers)))  # one worker will fail to load picky
        with pytest.raises(Exception, match="this worker cannot load picky"):
            client.load_model("picky")
        for _ in range(20):  # no worker serves picky: the one that loaded it unloaded it again
            fresh = httpclient.InferenceServerClient(g.url)
            assert not fresh.is_model_ready("picky")
            fresh.close()
        marker.write_text("0")
        client.load_model("picky")  # through one connection...
        assert pids_seen(g.url, workers, model="picky") == workers  # ...and every worker serves it
        client.unload_model("picky")
        for _ in range(20):
            fresh = httpclient.InferenceServerClient(g.url)
            assert not fresh.is_model_ready("picky")
            fresh.close()
        client.close()
    finally:
        assert g.stop() == 0


def test_a_large_config_override_reaches_every_worker_over_both_protocols(repo: Path) -> None:
    """Issue 23: a config override over 64 KiB is handed over by HTTP's driver and gRPC's call without a
    copy and its text taken by the parse; with workers the text still reaches the others and the journal
    (a worker started later replays it)."""
    add_model(repo, "extra", PID_CONFIG, PID_PY)
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT64", "dims": [1]}],
                         "parameters": {"filler": {"string_value": "x" * 200_000}}})
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "pid", workers=2)
    try:
        workers = set(g.wait_serving(2))
        client = httpclient.InferenceServerClient(g.url)
        client.load_model("extra", config=config)
        assert pids_seen(g.url, workers, model="extra") == workers
        client.unload_model("extra")
        grpc = grpcclient.InferenceServerClient(g.grpc_url)
        grpc.load_model("extra", config=config.replace("x" * 200_000, "y" * 200_000))
        assert pids_seen(g.url, workers, model="extra") == workers
        g.signal(signal.SIGTTIN)  # one more worker: it loads 'extra' from the journal, override and all
        added = g.wait_serving(3)[2]
        assert pids_seen(g.url, {*workers, added}, model="extra", tries=400) == {*workers, added}
        filler = client.get_model_config("extra")["parameters"]["filler"]["string_value"]
        assert filler == "y" * 200_000
        grpc.close()
        client.close()
    finally:
        assert g.stop() == 0


def test_poll_change_is_seen_by_every_worker(repo: Path) -> None:
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "poll", "--repository-poll-secs", "0.5",
                 workers=2)
    try:
        workers = set(g.wait_serving(2))
        add_model(repo, "late", PID_CONFIG, PID_PY)
        with gevent.Timeout(60, AssertionError("the new model never served from every worker")):
            while True:
                try:
                    if pids_seen(g.url, workers, model="late", tries=40) == workers:
                        break
                except Exception:
                    gevent.sleep(0.2)  # retry pace under the deadline
    finally:
        assert g.stop() == 0


def _load(url: str, grpc_url: str, stop: gevent.event.Event, failures: list[str], done: list[int]) -> None:
    http = httpclient.InferenceServerClient(url)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    hin = httpclient.InferInput("INPUT0", [1], "FP32")
    hin.set_data_from_numpy(np.zeros(1, np.float32))
    gin = grpcclient.InferInput("INPUT0", [1], "FP32")
    gin.set_data_from_numpy(np.zeros(1, np.float32))
    while not stop.is_set():
        for name, call in (("http", lambda: http.infer("pid", [hin])), ("grpc", lambda: grpc.infer("pid", [gin]))):
            try:
                call()
                done.append(1)
            except Exception as e:  # every failure is a test failure, collected
                failures.append(f"{name}: {e!r} {e}")
    http.close()
    grpc.close()


def test_hup_replaces_workers_one_at_a_time_with_no_failed_request(repo: Path) -> None:
    import gevent.event

    g = Gunicorn("--model-repository", str(repo), workers=2)
    try:
        old = set(g.wait_serving(2))
        stop, failures, done = gevent.event.Event(), [], []
        clients = [gevent.spawn(_load, g.url, g.grpc_url, stop, failures, done) for _ in range(3)]
        with gevent.Timeout(30, AssertionError("no traffic")):
            while len(done) < 20:
                gevent.sleep(0.05)  # local counter polled under a deadline
        g.signal(signal.SIGHUP)
        new = set(g.wait_serving(4)) - old
        assert len(new) == 2
        wait_gone(old)
        assert pids_seen(g.url, new) == new
        n = len(done)
        with gevent.Timeout(30, AssertionError("traffic stopped after the reload")):
            while len(done) < n + 20:
                gevent.sleep(0.05)  # local counter polled under a deadline
        stop.set()
        gevent.joinall(clients, timeout=30)
        assert failures == [], failures[:5]
        assert "rolling restart" in g.log()
    finally:
        assert g.stop() == 0


def test_a_killed_worker_is_replaced_and_replays_host_wide_changes(repo: Path, tmp_path: Path) -> None:
    add_model(repo, "extra", PID_CONFIG, PID_PY)
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "pid", workers=2)
    try:
        workers = g.wait_serving(2)
        client = httpclient.InferenceServerClient(g.url)
        client.load_model("extra")
        client.update_log_settings({"log_verbose_level": 1})
        os.kill(workers[0], signal.SIGKILL)
        replacement = g.wait_serving(3)[2]
        alive = {workers[1], replacement}
        assert pids_seen(g.url, alive, model="extra") == alive  # the new worker loaded 'extra' from the journal
        for _ in range(10):
            fresh = httpclient.InferenceServerClient(g.url)
            assert fresh.get_log_settings()["log_verbose_level"] == 1
            fresh.close()
        g.signal(signal.SIGTTIN)  # one more worker: it starts with the host's state too
        added = g.wait_serving(4)[3]
        alive.add(added)
        assert pids_seen(g.url, alive, model="extra", tries=400) == alive
        client.close()
    finally:
        assert g.stop() == 0


def test_term_drains_requests_in_flight(repo: Path, tmp_path: Path) -> None:
    gate, entered = tmp_path / "gate", tmp_path / "entered"
    add_model(repo, "slow", PID_CONFIG + 'instance_group [ { count: 12, kind: KIND_CPU } ]\n', PID_PY.replace(
        "    def execute(self, requests):\n",  # the model then polls the gate file the test writes
        f"    def execute(self, requests):\n        import time\n"
        f"        with open({str(entered)!r}, 'a') as f:\n            f.write('x\\n')\n"
        f"        while not os.path.exists({str(gate)!r}):\n            time.sleep(0.01)\n"))
    g = Gunicorn("--model-repository", str(repo), workers=2)
    try:
        g.wait_serving(2)
        results: list[object] = []

        def one() -> None:
            try:
                results.append(pid_infer(g.url, "slow"))
            except Exception as e:
                results.append(e)

        calls = [gevent.spawn(one) for _ in range(6)]
        with gevent.Timeout(60, AssertionError("the requests never all reached the model:\n" + g.log())):
            while not entered.exists() or len(entered.read_text().split()) < 6:
                gevent.sleep(0.05)  # polling a file another process writes: no event crosses processes
        g.signal(signal.SIGTERM)
        assert g.stderr.wait(lambda: sum("shutting down: waiting up to" in line for line in g.stderr.lines) >= 2,
                             60), "the workers never began to shut down:\n" + g.log()  # with the six still running
        gate.touch()
        gevent.joinall(calls, timeout=60)
        assert len(results) == 6 and all(isinstance(r, int) for r in results), results
        assert g.stop() == 0
    finally:
        g.stop()


def test_a_load_during_a_rolling_restart_reaches_the_new_workers(repo: Path) -> None:
    add_model(repo, "extra", PID_CONFIG, PID_PY)
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "pid", workers=2)
    try:
        old = set(g.wait_serving(2))
        client = httpclient.InferenceServerClient(g.url, network_timeout=120)
        g.signal(signal.SIGHUP)
        client.load_model("extra")  # while the new workers start (and the old ones still serve)
        new = set(g.wait_serving(4)) - old
        wait_gone(old)
        assert pids_seen(g.url, new) == new
        assert pids_seen(g.url, new, model="extra") == new
        client.close()
    finally:
        assert g.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_worker_exits_cleanly_with_onnxruntime_preloaded(repo: Path, sig: int) -> None:
    """The arbiter imports onnxruntime before it forks (a fast path); that import starts a native thread
    that the workers inherit as an object but not as a thread. Every worker still exits with status 0
    after requests over both protocols (before the fix each died of SIGABRT or SIGSEGV at exit)."""
    modelgen.onnx_mlp(repo, "mlp", dims=(4, 8, 2), max_batch_size=8)
    g = Gunicorn("--model-repository", str(repo), workers=2)
    try:
        g.wait_serving(2)
        x = np.ones((1, 4), np.float32)
        for mod, url in ((httpclient, g.url), (grpcclient, g.grpc_url)):
            for _ in range(4):  # fresh connections: both workers serve some
                client = mod.InferenceServerClient(url)
                try:
                    inp = mod.InferInput("INPUT0", [1, 4], "FP32")
                    inp.set_data_from_numpy(x)
                    assert client.infer("mlp", [inp]).as_numpy("OUTPUT0").shape == (1, 2)
                finally:
                    client.close()
        assert g.stop(sig) == 0
        log = "\n".join(g.stderr.lines)
        # the arbiter reaps its workers and says how each one ended: a signal or a non-zero status
        assert "was sent" not in log and "exited with code" not in log, g.log()
        assert "terminate called" not in log and "Fatal Python error" not in log, g.log()
        assert sum("Worker exiting" in line for line in g.stderr.lines) == 2, g.log()
    finally:
        g.stop()

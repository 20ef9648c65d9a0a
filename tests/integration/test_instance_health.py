"""A dead model instance leaves the scheduling pool; a version with none left is not ready (issue: instance health).

An instance whose native thread dies is restarted within its budget (runtime/supervisor.py: 3 a minute);
a process-isolated one restarts its process (3 failed starts at most). Past that it is DOWN. Before the
fix a DOWN instance stayed in its scheduler's pool: it answered UNAVAILABLE at once, looked idle and drew
the work, so with two instances, one dead, every sequential request failed; and a version with no live
instance stayed READY (model ready, index READY, strict server readiness true). Real servers, the
official tritonclient, bounded waits on conditions.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import index, wait_for
from .server import ServerProcess, add_model

# The magic input -7 makes the instance named VICTIM lose its native thread: it leaves 200 greenlets calling
# sys.exit on its thread's hub, which gevent re-raises into the thread's main greenlet while it waits for
# work (runtime/bridge.py gives up after MAX_INTERRUPTIONS in a row: the loop has died). The other instance
# holds -7 for 0.2 s, so that of two magic requests sent together one reaches the victim; -7 and -8
# answer the instance's index. With HUB the model sleeps in initialize: a gevent hub on its thread, so it
# is never promoted to run inline. Without, it is promoted (fast paths on), and the victim's -7 fails:
# inline, the batch is retried on its thread, where the greenlets are left; its thread dies after that.
KILLER_PY = """
import sys
import threading
import time
import gevent
import numpy as np
import triton_python_backend_utils as pb_utils

VICTIM, HUB = {victim!r}, {hub!r}

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.index = float(self.name.rsplit("_", 1)[1])
        self.thread = threading.get_native_id()
        if HUB:
            time.sleep(0)  # model code: gives its thread a gevent hub (time is patched), what is tested

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == -7 and self.name == VICTIM:
                if threading.get_native_id() == self.thread:
                    for _ in range(200):
                        gevent.spawn(sys.exit, "a greenlet of the model ended its thread")
                if not HUB:
                    raise ValueError("the victim fails")
            elif x[0] == -7:
                time.sleep(0.2)  # model code: holds -7 (see above)
            if x[0] < 0:
                x = np.array([self.index], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

# Process-isolated: -7 makes the VICTIM instance's process leave (os._exit) and mark the file MARK; while
# MARK exists, the VICTIM's new processes fail in initialize (os._exit): its restarts fail.
PROCESS_KILLER_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

VICTIM, MARK = {victim!r}, {mark!r}

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.index = float(self.name.rsplit("_", 1)[1])
        if self.name == VICTIM and os.path.exists(MARK):
            os._exit(3)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] == -7:
                if self.name == VICTIM:
                    open(MARK, "w").close()
                    os._exit(1)
                x = np.array([self.index], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
{extra}
"""
ISOLATED = 'parameters { key: "TRITON_ACTOR_ISOLATION" value { string_value: "process" } }'
FLAGS = ("--model-control-mode=explicit", "--load-model=*", "--strict-readiness=true")


def _infer(client: Any, model: str, value: float) -> float:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    x = module.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return float(client.infer(model, [x]).as_numpy("OUTPUT0")[0])


def _error(client: Any, model: str, value: float) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        _infer(client, model, value)
    return e.value


def _kill_thread_until_down(server: ServerProcess, model: str, victim: str, warm: int = 0) -> None:
    """Kill the victim's thread again and again (each time it is back) until it is past its budget. Two
    magic requests at a time, so that one reaches the victim whichever instance is first in the idle list."""
    index_of_victim = float(victim.rsplit("_", 1)[1])
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    try:
        for _ in range(40):  # bounded: 4 deaths are needed
            if "past its restart budget" in server.log():
                return
            deaths = server.log().count(f"native worker {victim} stopped unexpectedly")
            for _ in range(warm):  # promoted to run inline after 32 short runs (fast paths on)
                _infer(client, model, -8)
            x = httpclient.InferInput("INPUT0", [1], "FP32")
            x.set_data_from_numpy(np.array([-7], np.float32))
            ran_on = []
            for call in [client.async_infer(model, [x]) for _ in range(2)]:
                try:
                    ran_on.append(float(call.get_result().as_numpy("OUTPUT0")[0]))
                except InferenceServerException as e:
                    ran_on.append(index_of_victim if "the victim fails" in e.message() else -1.0)
            if index_of_victim in ran_on:
                wait_for(lambda d=deaths: server.log().count(f"native worker {victim} stopped unexpectedly") > d, 60,
                         f"{victim}'s thread to die:\n{server.log()[-3000:]}")
                # and back (or down for good) before the next warm-up: a request that reached the victim while
                # its death was being handled was answered UNAVAILABLE (a fresh-clone run with fast paths off)
                wait_for(lambda d=deaths: server.log().count(f"instance {victim} is serving again") > d
                         or "past its restart budget" in server.log(), 60,
                         f"{victim} back after its death:\n{server.log()[-3000:]}")
            else:  # the victim is restarting, out of the pool: wait until it serves again
                wait_for(lambda d=deaths: server.log().count(f"instance {victim} is serving again") >= d
                         or "past its restart budget" in server.log(), 60,
                         f"{victim} back:\n{server.log()[-3000:]}")
    finally:
        client.close()
    raise AssertionError(f"{victim} never went past its restart budget:\n{server.log()[-5000:]}")


def _all_succeed(server: ServerProcess, model: str, n: int = 40) -> None:
    http, grpc = httpclient.InferenceServerClient(server.url), grpcclient.InferenceServerClient(server.grpc_url)
    try:
        failures = []
        for i in range(n):
            client = http if i % 2 else grpc
            try:
                assert _infer(client, model, float(i + 1)) == float(i + 1)
            except InferenceServerException as e:
                failures.append(e.message())
        assert not failures, f"{len(failures)} of {n} failed, e.g. {failures[0]}"
    finally:
        http.close()
        grpc.close()


def _assert_not_ready(server: ServerProcess, model: str, reason: str) -> None:
    http, grpc = httpclient.InferenceServerClient(server.url), grpcclient.InferenceServerClient(server.grpc_url)
    try:
        wait_for(lambda: not http.is_model_ready(model), 60, f"'{model}' not ready")
        assert not grpc.is_model_ready(model)
        entry = index(http)[(model, "1")]
        assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"], entry
        assert not http.is_server_ready() and not grpc.is_server_ready()  # strict readiness
        assert http.is_server_live()
        for client in (http, grpc):
            e = _error(client, model, 1.0)
            assert e.message() == f"Request for unknown model: '{model}' has no available versions", e.message()
    finally:
        http.close()
        grpc.close()


def _load_again(server: ServerProcess, model: str) -> None:
    http = httpclient.InferenceServerClient(server.url)
    try:
        http.load_model(model)
        assert http.is_model_ready(model) and http.is_server_ready()
        assert index(http)[(model, "1")]["state"] == "READY"
    finally:
        http.close()
    _all_succeed(server, model)


# -- in-process: the instance's thread dies -------------------------------------------------------
def test_a_dead_instance_leaves_the_pool(tmp_path: Path, start_server) -> None:
    """Two instances, one past its restart budget: every later request succeeds on the other one
    (before the fix: every sequential request went to the dead one and failed UNAVAILABLE)."""
    add_model(tmp_path, "two", CONFIG.format(count=2, extra=""), KILLER_PY.format(victim="two_0_0", hub=True))
    server = start_server(tmp_path, flags=FLAGS)
    _kill_thread_until_down(server, "two", "two_0_0")
    http = httpclient.InferenceServerClient(server.url)
    try:
        _all_succeed(server, "two")
        assert http.is_model_ready("two") and http.is_server_ready()  # one instance serves: the version is ready
        assert index(http)[("two", "1")]["state"] == "READY"
        with urllib.request.urlopen(f"http://{server.url}/status.json", timeout=30) as answer:  # the status page's
            [row] = [v for v in json.load(answer)["versions"] if v["name"] == "two"]
        assert row["instances"] == ["two_0_0", "two_0_1"] and row["down_instances"] == ["two_0_0 (DOWN)"], row
    finally:
        http.close()


def test_a_dead_instance_that_ran_inline_leaves_the_pool(tmp_path: Path, start_server) -> None:
    """The victim is promoted to run inline before each death (fast paths on): its thread dies after a
    batch retried there. Past the budget only the healthy instance answers (before the fix the dead
    instance kept its inline mode and served on the hub with its model finalized)."""
    add_model(tmp_path, "inl", CONFIG.format(count=2, extra=""), KILLER_PY.format(victim="inl_0_0", hub=False))
    server = start_server(tmp_path, flags=FLAGS)
    _kill_thread_until_down(server, "inl", "inl_0_0", warm=40)
    http = httpclient.InferenceServerClient(server.url)
    try:
        assert {_infer(http, "inl", -8) for _ in range(40)} == {1.0}
        _all_succeed(server, "inl")
    finally:
        http.close()


def test_a_version_without_instances_is_not_ready_until_loaded_again(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "one", CONFIG.format(count=1, extra=""), KILLER_PY.format(victim="one_0_0", hub=True))
    server = start_server(tmp_path, flags=FLAGS)
    _kill_thread_until_down(server, "one", "one_0_0")
    _assert_not_ready(server, "one", "no instance left: instance 'one_0_0' stopped 4 times within 60 s")
    _load_again(server, "one")  # fresh instances, a fresh budget


# -- process-isolated: the model's process dies and cannot start again ----------------------------
def _kill_process(server: ServerProcess, model: str, victim: str) -> None:
    http = httpclient.InferenceServerClient(server.url)
    try:
        for _ in range(20):  # bounded: until the victim ran the magic request
            try:
                _infer(http, model, -7)
            except InferenceServerException as e:
                assert "the model's process exited with code 1 while it ran them" in e.message(), e.message()
                break
        else:
            raise AssertionError(f"{victim} never ran the magic request")
    finally:
        http.close()


def test_an_isolated_instance_that_cannot_restart_leaves_the_pool(tmp_path: Path, start_server) -> None:
    mark = tmp_path / "crashed"
    add_model(tmp_path, "iso", CONFIG.format(count=2, extra=ISOLATED),
              PROCESS_KILLER_PY.format(victim="iso_0_0", mark=str(mark)))
    server = start_server(tmp_path, flags=FLAGS)
    _kill_process(server, "iso", "iso_0_0")
    _all_succeed(server, "iso")  # meanwhile iso_0_0 tries to start its process, out of the pool
    wait_for(lambda: "instance iso_0_0 left the pool (DOWN)" in server.log(), 60, "iso_0_0 out of the pool for good")
    _all_succeed(server, "iso")
    http = httpclient.InferenceServerClient(server.url)
    try:
        assert http.is_model_ready("iso") and http.is_server_ready()
    finally:
        http.close()


def test_an_isolated_version_without_instances_is_not_ready_until_loaded_again(tmp_path: Path, start_server) -> None:
    mark = tmp_path / "crashed"
    add_model(tmp_path, "iso1", CONFIG.format(count=1, extra=ISOLATED),
              PROCESS_KILLER_PY.format(victim="iso1_0_0", mark=str(mark)))
    server = start_server(tmp_path, flags=FLAGS)
    _kill_process(server, "iso1", "iso1_0_0")
    _assert_not_ready(server, "iso1", "instance 'iso1_0_0': its process could not be restarted (3 attempts")
    mark.unlink()  # the cause is fixed
    _load_again(server, "iso1")


# -- the sequence batcher ---------------------------------------------------------------------------
def _in_sequence(client: httpclient.InferenceServerClient, value: float, seq: int, **flags: bool) -> float:
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return float(client.infer("sq", [x], sequence_id=seq, **flags).as_numpy("OUTPUT0")[0])


def test_a_dead_instance_takes_no_new_sequences(tmp_path: Path, start_server) -> None:
    """Sequence batcher, two instances: a sequence on the victim ends with its thread (its next request
    needs START again); past the budget every new sequence runs on the other instance (before the fix
    new sequences were still given the dead instance's slot)."""
    add_model(tmp_path, "sq", CONFIG.format(count=2, extra="sequence_batching { }"),
              KILLER_PY.format(victim="sq_0_0", hub=True))
    server = start_server(tmp_path, flags=FLAGS)
    http = httpclient.InferenceServerClient(server.url)
    try:
        seq = 100
        for _ in range(40):  # bounded: 4 deaths are needed
            if "past its restart budget" in server.log():
                break
            seq += 1
            # the hub's line, logged where it ends the instance's sequences (the worker thread logs its own
            # line first: a request sent on that one could still reach the instance before the hub knew)
            deaths = server.log().count("instance sq_0_0 stopped")
            # a new sequence goes to the least loaded instance, the lowest index first: the victim when it is up
            if _in_sequence(http, -7, seq, sequence_start=True) == 0.0:
                wait_for(lambda d=deaths: server.log().count("instance sq_0_0 stopped") > d, 60,
                         "the hub to see sq_0_0's thread die")
                with pytest.raises(InferenceServerException) as e:  # the sequence ended with its instance
                    _in_sequence(http, 1.0, seq, sequence_end=True)
                assert "must specify the START flag" in e.value.message(), e.value.message()
            else:
                wait_for(lambda d=deaths: server.log().count("instance sq_0_0 is serving again") >= d, 60, "sq_0_0 back")
        else:
            raise AssertionError(f"sq_0_0 never went past its restart budget:\n{server.log()[-5000:]}")
        for seq in range(1000, 1010):
            assert _in_sequence(http, 1.0, seq, sequence_start=True) == 1.0
            assert _in_sequence(http, -8, seq) == 1.0  # ran on sq_0_1
            assert _in_sequence(http, 3.0, seq, sequence_end=True) == 3.0
        assert http.is_model_ready("sq")
    finally:
        http.close()


def test_poll_mode_loads_a_version_without_instances_again_when_its_files_change(tmp_path: Path, start_server) -> None:
    """POLL: the version stays unavailable while its files are unchanged (as a failed load does) and
    is loaded again, with fresh instances, once they change."""
    model_dir = add_model(tmp_path, "one", CONFIG.format(count=1, extra=""), KILLER_PY.format(victim="one_0_0", hub=True))
    server = start_server(tmp_path, flags=("--model-control-mode=poll", "--repository-poll-secs=1"))
    _kill_thread_until_down(server, "one", "one_0_0")
    _assert_not_ready(server, "one", "no instance left: instance 'one_0_0' stopped 4 times within 60 s")
    http = httpclient.InferenceServerClient(server.url)
    try:
        add_model(tmp_path, "other", CONFIG.format(count=1, extra=""), KILLER_PY.format(victim="none", hub=True))
        wait_for(lambda: http.is_model_ready("other"), 60, "a poll that loads another model")
        assert not http.is_model_ready("one")
        (model_dir / "1" / "model.py").write_text(KILLER_PY.format(victim="none", hub=True))
        wait_for(lambda: http.is_model_ready("one"), 60, f"'one' loaded again:\n{server.log()[-3000:]}")
        assert http.is_server_ready() and index(http)[("one", "1")]["state"] == "READY"
    finally:
        http.close()
    _all_succeed(server, "one")

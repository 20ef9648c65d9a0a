"""EXPLICIT model control through the official client: startup models, load, unload, reload, overrides."""

from __future__ import annotations

import base64
import itertools
import json
import tempfile
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import Hammer, add_tagged, ask, index, tagged, wait_for
from .server import IDENTITY_CONFIG, add_gated_model, add_model
from .test_examples import _post
from .test_lifecycle import BAD_INIT_PY

EXPLICIT = ("--model-control-mode=explicit",)


def _error(call, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call(*args, **kw)
    return e.value


def test_load_unload_and_index(tmp_path: Path, start_server) -> None:
    add_tagged(tmp_path, "a")
    add_tagged(tmp_path, "b", edition=7)
    add_model(tmp_path, "bad_init", IDENTITY_CONFIG, BAD_INIT_PY)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model", "a"))
    client = httpclient.InferenceServerClient(server.url)
    assert index(client) == {("a", "1"): {"name": "a", "version": "1", "state": "READY"},
                             ("b", ""): {"name": "b"}, ("bad_init", ""): {"name": "bad_init"}}
    assert client.is_server_ready()
    client.load_model("b")
    assert ask(client, "b") == 107
    client.load_model("b")  # unchanged: a no-op
    assert server.log().count("successfully loaded 'b' version 1") == 1

    client.unload_model("a")  # returns before the model is gone (Triton)
    wait_for(lambda: index(client)[("a", "1")].get("reason") == "unloaded", what="a unloaded")
    assert index(client)[("a", "1")]["state"] == "UNAVAILABLE"
    e = _error(ask, client, "a")
    assert e.status() == "404" and "has no available versions" in e.message()
    assert client.is_server_ready()  # an unloaded model does not count against readiness
    client.load_model("a")  # loaded again from disk
    assert ask(client, "a") == 100

    client.unload_model("nope")  # unknown: 200, as Triton
    e = _error(client.load_model, "nope")
    assert e.status() == "500" and e.message() == "failed to load 'nope', failed to poll from model repository"

    e = _error(client.load_model, "bad_init")
    assert e.status() == "400"
    assert e.message().startswith("load failed for model 'bad_init': version 1 is at UNAVAILABLE state: "
                                  "Internal: RuntimeError: initialize failed on purpose")
    assert index(client)[("bad_init", "1")]["state"] == "UNAVAILABLE"
    assert not client.is_server_ready()  # strict readiness: not ready while a model is not
    assert {e["name"] for e in _ready_index(server)} == {"a", "b"}


def _ready_index(server) -> list[dict]:
    status, _, body = _post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200
    return json.loads(body)


def test_load_model_star_and_flag_errors(tmp_path: Path, start_server) -> None:
    add_tagged(tmp_path, "a")
    add_tagged(tmp_path, "b")
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=*"))
    assert {e["name"] for e in _ready_index(server)} == {"a", "b"}
    bad = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=*", "--load-model=a"), wait=False)
    assert bad.wait_exit(60) != 0 and "must be the only --load-model" in bad.log()
    missing = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=nope"), wait=False)
    assert missing.wait_exit(60) == 1 and "failed to load 'nope', failed to poll from model repository" in missing.log()


def test_poll_and_none_modes_refuse_the_api(tmp_path: Path, start_server) -> None:
    add_tagged(tmp_path, "a")
    for mode in ("none", "poll"):
        server = start_server(tmp_path, flags=(f"--model-control-mode={mode}",))
        client = httpclient.InferenceServerClient(server.url)
        for call in (client.load_model, client.unload_model):
            e = _error(call, "a")
            assert e.status() == "503"
            assert e.message() == "explicit model load / unload is not allowed if polling is enabled"
        server.stop()


def test_reload_picks_up_changes_and_new_versions(tmp_path: Path, start_server) -> None:
    model_dir = add_tagged(tmp_path, "m", edition=1)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=m"))
    client = httpclient.InferenceServerClient(server.url)
    assert ask(client, "m") == 101
    (model_dir / "1" / "model.py").write_text(tagged(2))
    client.load_model("m")
    assert ask(client, "m") == 102
    (model_dir / "2").mkdir()
    (model_dir / "2" / "model.py").write_text(tagged(2))
    client.load_model("m")  # default policy latest 1: version 2 in, version 1 out
    assert ask(client, "m") == 202
    wait_for(lambda: index(client)[("m", "1")].get("reason") == "unloaded", what="version 1 unloaded")
    # a version_policy change adds only what it names: version 2 is not reloaded
    (model_dir / "config.pbtxt").write_text(IDENTITY_CONFIG + "\nversion_policy: { all { } }\n")
    client.load_model("m")
    assert ask(client, "m", "1") == 102 and ask(client, "m", "2") == 202
    assert server.log().count("successfully loaded 'm' version 2") == 1


def test_an_unload_right_after_a_reload_does_not_wait_for_the_old_versions_drain(tmp_path: Path,
                                                                                   start_server) -> None:
    """A reload answers at the swap; the version it replaced drains behind it (a request is held there).
    An unload told meanwhile is answered at once, as Triton's: it waited for that drain, which lasts as
    long as the old version's slowest request. The held request is still answered, by the old version."""
    log, gate = tmp_path / "ran", tmp_path / "gate"
    model_dir = add_gated_model(tmp_path / "repo", "g", log, gate)
    server = start_server(tmp_path / "repo", flags=(*EXPLICIT, "--load-model=g"))
    client = httpclient.InferenceServerClient(server.url, concurrency=2, network_timeout=120)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    try:
        held = client.async_infer("g", [x])  # the old version holds it until the gate opens
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the held request to run")
        with open(model_dir / "1" / "model.py", "a") as f:
            f.write("# changed: the load reloads\n")
        client.load_model("g")
        unload = gevent.spawn(client.unload_model, "g")
        unload.join(30)  # (a bound: it is answered at once, or after the drain, which waits for the gate)
        assert unload.successful(), "the unload waited for the reload's drain"
        with pytest.raises(InferenceServerException, match="failed to obtain inference response"):
            held.get_result(block=False)  # still held by the old version
    finally:
        gate.touch()
    assert held.get_result().as_numpy("OUTPUT0").tolist() == [1.0]
    wait_for(lambda: index(client)[("g", "1")].get("reason") == "unloaded", what="the model unloaded")
    client.close()


def test_broken_update_keeps_the_old_version_serving(tmp_path: Path, start_server) -> None:
    model_dir = add_tagged(tmp_path, "m", edition=1)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=m"))
    client = httpclient.InferenceServerClient(server.url)
    (model_dir / "config.pbtxt").write_text("max_batch_size: -3 nonsense {")
    e = _error(client.load_model, "m")
    # a config that does not parse fails Triton's poll: 500, its text, the reason after it
    assert e.status() == "500" and e.message().startswith("failed to load 'm', failed to poll from model repository: ")
    assert "config.pbtxt" in e.message()
    assert ask(client, "m") == 101
    entry = index(client)[("m", "1")]
    assert entry["state"] == "READY" and entry["reason"].startswith("update failed, the previous version keeps serving")
    assert client.is_server_ready()

    (model_dir / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (model_dir / "1" / "model.py").write_text(BAD_INIT_PY)
    e = _error(client.load_model, "m")
    assert e.status() == "400" and "initialize failed on purpose" in e.message()
    assert ask(client, "m") == 101
    assert "initialize failed on purpose" in index(client)[("m", "1")]["reason"]

    (model_dir / "1" / "model.py").write_text(tagged(3))
    client.load_model("m")
    assert ask(client, "m") == 103
    assert index(client)[("m", "1")] == {"name": "m", "version": "1", "state": "READY"}


def test_config_and_file_overrides(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    model_dir = add_tagged(repo, "m", edition=1)
    before = sorted(p.name for p in model_dir.rglob("*"))
    server = start_server(repo, flags=(*EXPLICIT, "--load-model=m"))
    client = httpclient.InferenceServerClient(server.url)
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "parameters": {"note": {"string_value": "override"}}})
    client.load_model("m", config=config)  # config only: the files on disk, this config
    assert ask(client, "m") == 101
    assert client.get_model_config("m")["parameters"]["note"]["string_value"] == "override"
    client.load_model("m", config=config, files={"file:5/model.py": tagged(9).encode()})
    assert ask(client, "m") == 509  # served from the private override directory
    assert sorted(p.name for p in model_dir.rglob("*")) == before  # the repository is untouched
    client.load_model("m")  # without overrides: back to the repository's files
    assert ask(client, "m") == 101
    # gRPC's RepositoryModelLoad hands the data plane its own parameters too (the text popped, then
    # parsed from its one-shot holder: issue 23)
    import tritonclient.grpc as grpcclient
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.load_model("m", config=config.replace('"override"', '"over gRPC"'))
    assert client.get_model_config("m")["parameters"]["note"]["string_value"] == "over gRPC"
    client.load_model("m")
    assert ask(client, "m") == 101
    # past 64 KiB, the config is parsed and the files written on a native thread (actors/repository/actor.py)
    big = json.loads(config)
    big["parameters"].update({f"p{i}": {"string_value": "x" * 64} for i in range(2000)})
    padding = b"#" + b"x" * 100_000 + b"\n"
    client.load_model("m", config=json.dumps(big), files={"file:5/model.py": padding + tagged(11).encode()})
    assert ask(client, "m") == 511 and client.get_model_config("m")["parameters"]["p1999"]["string_value"] == "x" * 64
    big["input"][0]["dims"] = "bad"
    with pytest.raises(InferenceServerException) as e:
        client.load_model("m", config=json.dumps(big))
    big_error = (e.value.status(), e.value.message())
    small = json.loads(config)
    small["input"][0]["dims"] = "bad"
    with pytest.raises(InferenceServerException) as e:
        client.load_model("m", config=json.dumps(small))
    assert big_error == (e.value.status(), e.value.message())  # the same answer as on the hub
    assert "Invalid config override" in big_error[1] and ask(client, "m") == 511
    assert "Traceback" not in server.log()


POLL_FAILED = "failed to load '{}', failed to poll from model repository: "


# Triton answers most of these 500 "failed to load 'm', failed to poll from model repository" and logs
# the reason (scripts/triton_reference/NOTES.md, pass 4); we append the reason to the same text.
@pytest.mark.parametrize(("name", "params", "status", "message"), [
    ("m", {"config": "{not json"}, 500, POLL_FAILED.format("m") + "model 'm': Invalid config override"),
    # what tritonclient's simple_http_model_control.py sends as its malformed override
    ("m", {"config": '"parameters": {"config": {{"max_batch_size": "16"}}}'}, 500,
     POLL_FAILED.format("m") + "Invalid config override: the 'config' parameter must be a JSON object"),
    ("m", {"config": json.dumps({"inputs": []})}, 500, "has no field named \"inputs\""),
    ("m", {"config": json.dumps({"name": "other"})}, 500, "names model 'other'"),
    ("m", {"file:1/model.py": "eA=="}, 500, "file overrides need a 'config' parameter"),
    ("m", {"config": "{}", "file:../escape.py": "eA=="}, 500, "invalid file override 'file:../escape.py'"),
    ("m", {"config": "{}", "file:1/../../escape.py": "eA=="}, 500, "invalid file override"),
    ("m", {"config": "{}", "file:/tmp/escape.py": "eA=="}, 500, "invalid file override"),
    ("m", {"config": "{}", "file:1/model.py": "***"}, 400, "is not valid base64"),
    ("m", {"config": 7}, 500, "'config' parameter must be a string"),
    # refused before it is parsed (a 103 MB one peaked at 928 MB): repository/overrides.MAX_CONFIG_BYTES
    ("m", {"config": '{"backend": "python"}' + " " * (4 << 20)}, 400, "more than the 4194304 a model configuration"),
    ("%2E%2E", {}, 500, POLL_FAILED.format("..") + "a model name is one folder name"),
    (".hidden", {}, 500, POLL_FAILED.format(".hidden") + "a model name is one folder name"),
    ("a%2Fb", {}, 404, ""),
])
def test_bad_load_requests(tmp_path: Path, start_server, name: str, params: dict, status: int, message: str) -> None:
    repo = tmp_path / "repo"
    add_tagged(repo, "m", edition=1)
    server = start_server(repo, flags=(*EXPLICIT, "--load-model=m"))
    body = json.dumps({"parameters": params}).encode()
    got, _, data = _post(server, f"/v2/repository/models/{name}/load", body)
    assert got == status, data
    if message:
        assert message in json.loads(data)["error"]
    polled = POLL_FAILED.format(name.replace("%2E", "."))
    if message and polled in json.loads(data)["error"]:  # the reason is logged too, in Triton's words (L0_http greps them)
        reason = message.split(polled)[-1]  # logged before the answer, but read from the pipe by a reader: wait for it
        assert server.stderr.wait(lambda: any("Poll failed for model directory" in line and reason in line
                                              for line in server.log().splitlines()), 30), server.log()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # nothing written beside the repository
    assert ask(httpclient.InferenceServerClient(server.url), "m") == 101  # still serving


def test_malformed_load_body_is_triton_500(tmp_path: Path, start_server) -> None:
    add_tagged(tmp_path, "m")
    server = start_server(tmp_path, flags=EXPLICIT)
    status, _, data = _post(server, "/v2/repository/models/m/load", b'{"parameters":')
    assert status == 500 and json.loads(data)["error"].startswith("failed to parse the request JSON buffer")


GATED_PY = """
import os
import time

class TritonPythonModel:
    def initialize(self, args):
        while not os.path.exists(os.path.join(args["model_repository"], "release")):
            time.sleep(0.02)  # model code polling a file the test writes

    def execute(self, requests):
        return []
"""


def test_readiness_while_loading(tmp_path: Path, start_server) -> None:
    """Strict readiness: not ready while a model loads; ready again once it is READY."""
    add_tagged(tmp_path, "a")
    gated = add_model(tmp_path, "gated", IDENTITY_CONFIG, GATED_PY)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=a"))
    client = httpclient.InferenceServerClient(server.url)
    relaxed = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=a", "--strict-readiness=false"))
    relaxed_client = httpclient.InferenceServerClient(relaxed.url)
    assert client.is_server_ready()
    loads = [gevent.spawn(httpclient.InferenceServerClient(s.url).load_model, "gated") for s in (server, relaxed)]
    for c in (client, relaxed_client):
        wait_for(lambda c=c: index(c).get(("gated", "1"), {}).get("state") == "LOADING", what="gated loading")
    assert not client.is_server_ready()
    assert relaxed_client.is_server_ready()
    assert ask(client, "a") == 100  # other models serve meanwhile
    (gated / "release").write_text("")
    gevent.joinall(loads, timeout=30, raise_error=True)
    assert client.is_server_ready() and client.is_model_ready("gated")


COUNTING_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executions")

    def execute(self, requests):
        with open(self.log, "a") as f:
            f.write("%d\\n" % pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy().size)
        if os.path.exists(os.path.join(os.path.dirname(self.log), "fail")):
            raise ValueError("warmup refused on purpose")
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for _ in requests]
"""
WARMUP_CONFIG = IDENTITY_CONFIG + """
instance_group [ { count: 2, kind: KIND_CPU } ]
model_warmup [ { name: "zeros", batch_size: 1, count: 3,
                 inputs { key: "INPUT0" value: { data_type: TYPE_FP32, dims: [ 5 ], zero_data: true } } } ]
"""


def test_model_warmup_runs_before_ready(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "warm", WARMUP_CONFIG, COUNTING_PY)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=warm"))
    assert (model_dir / "executions").read_text().split() == ["5"] * 6  # 3 runs on each of 2 instances
    (model_dir / "fail").write_text("")
    (model_dir / "1" / "model.py").write_text(COUNTING_PY + "\n# edited\n")
    e = _error(httpclient.InferenceServerClient(server.url).load_model, "warm")
    assert e.status() == "400" and "warmup sample 'zeros' failed" in e.message()
    assert "warmup refused on purpose" in e.message()


SLOW_INIT_PY = """
import os
import time

class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(os.path.dirname(args["model_repository"]), "spans"), "a") as f:
            start = time.time()
            time.sleep(0.6)  # model code: a slow load (the work)
            f.write("%f %f\\n" % (start, time.time()))

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_model_load_thread_count_bounds_parallel_loads(tmp_path: Path, start_server, threads: int) -> None:
    repo = tmp_path / "repo"
    for name in ("s1", "s2", "s3"):
        add_model(repo, name, IDENTITY_CONFIG, SLOW_INIT_PY)
    start_server(repo, flags=(f"--model-load-thread-count={threads}",))
    spans = sorted(tuple(map(float, line.split())) for line in (repo / "spans").read_text().splitlines())
    overlapping = any(b[0] < a[1] for a, b in itertools.pairwise(spans))
    assert overlapping == (threads > 1), spans


def test_explicit_reloads_under_load_fail_no_request(tmp_path: Path, start_server) -> None:
    model_dir = add_tagged(tmp_path, "m", edition=0)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model=m"))
    client = httpclient.InferenceServerClient(server.url)
    load = Hammer(server.url, "m")
    for edition in range(1, 11):
        (model_dir / "1" / "model.py").write_text(tagged(edition))
        client.load_model("m")
        assert ask(client, "m") == 100 + edition  # load returns after the swap
    load.stop()
    assert load.sent > 0 and not load.failures, load.failures[:5]


def test_load_unload_over_grpc(tmp_path: Path, start_server) -> None:
    """The repository RPCs reach the same data-plane calls: load, reload with overrides, unload, index,
    and Triton's codes for refusals."""
    import tritonclient.grpc as grpcclient

    add_tagged(tmp_path, "a")
    add_tagged(tmp_path, "b", edition=7)
    server = start_server(tmp_path, flags=(*EXPLICIT, "--load-model", "a"))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.url)
    states = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert states == {("a", "1"): "READY", ("b", ""): ""}
    client.load_model("b")
    assert client.is_model_ready("b") and ask(http, "b") == 107
    client.load_model("b", files={"file:1/model.py": tagged(8).encode()},
                      config=json.dumps({"backend": "python", "max_batch_size": 0,
                                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}))
    assert ask(http, "b") == 108
    client.unload_model("a")
    wait_for(lambda: not client.is_model_ready("a"), what="a unloaded over gRPC")
    e = _error(client.load_model, "nope")
    assert e.status() == "StatusCode.INTERNAL" and "failed to poll from model repository" in e.message()
    e = _error(client.load_model, "../a")
    assert e.status() == "StatusCode.INTERNAL" and "a model name is one folder name" in e.message()
    none_server = start_server(tmp_path)  # NONE mode refuses the API: UNAVAILABLE
    e = _error(grpcclient.InferenceServerClient(none_server.grpc_url).load_model, "a")
    assert e.status() == "StatusCode.UNAVAILABLE" and "explicit model load / unload is not allowed" in e.message()


@pytest.mark.parametrize("code", ["import no_such_module_for_the_test\n",  # fails at import (auto-complete)
                                  "class TritonPythonModel:\n    def initialize(self, args):\n"
                                  "        raise RuntimeError('from ' + args['model_repository'])\n"])
def test_a_failed_load_does_not_name_the_servers_temporary_folder(tmp_path: Path, start_server, code: str) -> None:
    """A load request's files are written to a temporary folder of the server; a model failing there
    is reported with its traceback (Triton's text), which named that folder to the client (and so the
    server's temporary directory): now ``<load request>/1/model.py`` in the answer and the index."""
    repo = tmp_path / "repo"
    add_tagged(repo, "m", edition=1)
    server = start_server(repo, flags=EXPLICIT)
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
    body = json.dumps({"parameters": {"config": config,
                                      "file:1/model.py": base64.b64encode(code.encode()).decode()}}).encode()
    got, _, data = _post(server, "/v2/repository/models/m/load", body)
    _, _, index = _post(server, "/v2/repository/index", b"{}")
    assert got in (400, 500)
    for text in (data.decode(), index.decode()):
        assert "<load request>/1/model.py" in text and "triton_actor_m_" not in text, text
        assert tempfile.gettempdir() + "/" not in text, text


RAISING_PY = """
import os


class TritonPythonModel:
    def initialize(self, args):
        self.data = os.path.join(args["model_repository"], "data.bin")

    def execute(self, requests):
        raise RuntimeError("cannot read " + self.data)
"""


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_running_model_s_error_names_its_own_files_but_not_the_servers_temporary_folder(
        tmp_path: Path, start_server, isolation: str) -> None:
    """Triton answers an exception of ``execute`` with the model's traceback (pb_stub.cc), whose paths are
    the model's files where the server keeps them: the user's own for a repository on disk (kept: users
    need them), but a folder of the server's for a load request's files. Those are named as the load
    error names them, ``<load request>``, in the traceback and in the message alike (before, only the
    load's error was: a running model's named the server's temporary directory); isolated as in-process."""
    repo = tmp_path / "repo"
    parameters = f'parameters [ {{ key: "TRITON_ACTOR_ISOLATION" value: {{ string_value: "{isolation}" }} }} ]'
    add_model(repo, "on_disk", IDENTITY_CONFIG + parameters, RAISING_PY)
    add_model(repo, "uploaded", IDENTITY_CONFIG, RAISING_PY)  # loaded below from the request's files only
    server = start_server(repo, flags=(*EXPLICIT, "--load-model=on_disk"))
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "parameters": {"TRITON_ACTOR_ISOLATION": {"string_value": isolation}}})
    body = json.dumps({"parameters": {"config": config,
                                      "file:1/model.py": base64.b64encode(RAISING_PY.encode()).decode()}}).encode()
    got, _, data = _post(server, "/v2/repository/models/uploaded/load", body)
    assert got == 200, data
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros(1, np.float32))
    texts = {}
    for model in ("on_disk", "uploaded"):
        with pytest.raises(InferenceServerException) as e:
            client.infer(model, inputs)
        texts[model] = e.value.message()
    own = str(repo / "on_disk")
    assert f"cannot read {own}/data.bin" in texts["on_disk"] and f"{own}/1/model.py(" in texts["on_disk"], texts
    uploaded = texts["uploaded"]
    assert "cannot read <load request>/data.bin" in uploaded and "<load request>/1/model.py(" in uploaded, uploaded
    assert "triton_actor_uploaded_" not in uploaded and tempfile.gettempdir() + "/" not in uploaded, uploaded

"""Model repositories on S3 (moto's server, a real S3-protocol endpoint): load at startup, POLL picking up
an added, a changed and a removed model, EXPLICIT loads re-reading the bucket, object keys that would
leave the cache folder refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pids_seen
from .model_control import add_tagged, answers, ask, gone, index, tagged, wait_for
from .s3 import Bucket, moto_endpoint  # noqa: F401 - the fixture
from .server import IDENTITY_CONFIG

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.5")
WITHIN = 20.0  # a poll period, the settle time (1 s) and a python model's load, with margin on a busy machine


def _upload_tagged(bucket: Bucket, scratch: Path, prefix: str, name: str, edition: int) -> None:
    add_tagged(scratch, name, edition=edition)
    bucket.upload(scratch / name, f"{prefix}/{name}")


def test_s3_repository_loads_at_startup_and_polls_changes(tmp_path: Path, moto_endpoint: str,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch, start_server) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(cache))
    bucket = Bucket(moto_endpoint, "models")
    _upload_tagged(bucket, tmp_path / "v1", "deep/repo", "a", edition=1)
    bucket.put("deep/repo/../escape.txt", "outside")  # keys S3 allows and a mirror must never write
    bucket.put("deep/repo/a/./../../escape.txt", "outside")
    bucket.put("deep/repository-sibling/x/config.pbtxt", "not under the prefix")
    server = start_server("s3://models/deep/repo", flags=POLL)
    client = httpclient.InferenceServerClient(server.url)
    assert ask(client, "a") == 101
    assert set(index(client)) == {("a", "1")}  # the sibling prefix is not part of the repository

    _upload_tagged(bucket, tmp_path / "v2", "deep/repo", "b", edition=2)
    wait_for(lambda: answers(client, "b", 102), WITHIN, "model b added on S3 to serve")
    bucket.put("deep/repo/a/1/model.py", tagged(3))
    wait_for(lambda: answers(client, "a", 103), WITHIN, "model a changed on S3 to serve its new code")
    bucket.delete_prefix("deep/repo/b/")
    wait_for(lambda: gone(client, "b"), WITHIN, "model b removed from S3 to be unloaded")
    wait_for(lambda: ("b", "1") not in index(client), WITHIN, "b to leave the index")
    assert ask(client, "a") == 103

    assert "refused" in server.log()
    assert not list(tmp_path.rglob("escape.txt"))  # nothing was written outside the mirror
    mirrors = [p for p in cache.iterdir() if p.name.startswith("triton-actor-repo-")]
    assert len(mirrors) == 1 and (mirrors[0] / "repository" / "a" / "1" / "model.py").read_text() == tagged(3)
    assert server.stop() == 0
    assert not mirrors[0].exists()  # the cache folder is removed at shutdown


def test_s3_explicit_load_rereads_the_bucket(tmp_path: Path, moto_endpoint: str, start_server) -> None:  # noqa: F811
    """Triton's ``s3://host:port/bucket/prefix`` form (no AWS_ENDPOINT_URL); gRPC and HTTP load the model."""
    bucket = Bucket(moto_endpoint, "explicit")
    host_port = moto_endpoint.removeprefix("http://")
    server = start_server(f"s3://{host_port}/explicit/models", flags=("--model-control-mode=explicit",))
    client = httpclient.InferenceServerClient(server.url)
    assert index(client) == {}

    _upload_tagged(bucket, tmp_path / "v1", "models", "a", edition=1)  # added after the server started
    client.load_model("a")
    assert ask(client, "a") == 101
    bucket.put("models/a/1/model.py", tagged(4))
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.load_model("a")  # a load re-reads the repository, as Triton polls it on every load
    assert ask(client, "a") == 104

    with pytest.raises(InferenceServerException) as e:
        client.load_model("missing")
    assert "failed to load 'missing'" in e.value.message()
    assert ask(client, "a") == 104


def test_unreachable_s3_repository_fails_startup(tmp_path: Path, moto_endpoint: str, start_server,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    server = start_server("s3://no-such-bucket/models", wait=False)
    assert server.wait_exit(60) == 1
    assert "failed to read model repository 's3://no-such-bucket/models'" in server.log()


@pytest.mark.timeout(240)
def test_s3_repository_with_workers(tmp_path: Path, moto_endpoint: str,  # noqa: F811
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Under gunicorn every worker mirrors the bucket (a cache folder each) and POLL reaches all of them."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    bucket = Bucket(moto_endpoint, "workers")
    bucket.put("repo/pid/config.pbtxt", PID_CONFIG)
    bucket.put("repo/pid/1/model.py", PID_PY)
    g = Gunicorn("--model-repository", "s3://workers/repo", *POLL, workers=2)
    try:
        workers = set(g.wait_serving(2))
        assert pids_seen(g.url, workers) == workers
        bucket.put("repo/pid2/config.pbtxt", PID_CONFIG)
        bucket.put("repo/pid2/1/model.py", PID_PY)
        wait_for(lambda: g.log().count("successfully loaded 'pid2'") >= 2, WITHIN, "pid2 loaded by both workers")
        assert pids_seen(g.url, workers, model="pid2") == workers
    finally:
        assert g.stop() == 0


FAILING_PY = """
import os


class TritonPythonModel:
    def initialize(self, args):
        self.data = os.path.join(args["model_repository"], "data.bin")
        if args["model_name"] == "bad_init":
            raise RuntimeError("cannot open " + self.data)

    def execute(self, requests):
        raise RuntimeError("cannot read " + self.data)
"""


def test_s3_model_errors_name_the_bucket_not_the_local_copy(tmp_path: Path, moto_endpoint: str,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch, start_server) -> None:
    """A model of an object-store repository runs from the server's local copy: its traceback (Triton's
    text) named that copy, a temporary folder of the server. Its errors, at load and while it runs, name
    the repository's URL instead, so the user still finds the file."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(cache))
    bucket = Bucket(moto_endpoint, "failing")
    for name in ("bad_run", "bad_init"):
        bucket.put(f"repo/{name}/config.pbtxt", IDENTITY_CONFIG)
        bucket.put(f"repo/{name}/1/model.py", FAILING_PY)
    server = start_server("s3://failing/repo", flags=("--model-control-mode=explicit", "--load-model=bad_run"))
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as load:
        client.load_model("bad_init")
    inputs = [httpclient.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException) as run:
        client.infer("bad_run", inputs)
    reason = {m["name"]: m.get("reason", "") for m in client.get_model_repository_index()}["bad_init"]
    for text, name, what in ((run.value.message(), "bad_run", "read"), (load.value.message(), "bad_init", "open"),
                             (reason, "bad_init", "open")):
        url = f"s3://failing/repo/{name}"
        assert f"cannot {what} {url}/data.bin" in text and f"{url}/1/model.py(" in text, text
        assert str(cache) not in text and "triton-actor-repo-" not in text, text


"""--http-restricted-api / --grpc-restricted-protocol through tritonclient (docs/security.md#restricted-apis)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model

pytestmark = pytest.mark.timeout(120)
REFUSED = "This API is restricted, expecting header 'infer-key'"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("repo")
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    s = ServerProcess(repo, flags=("--model-control-mode", "explicit", "--load-model", "identity",
                                   "--http-restricted-api", "inference,model-repository:infer-key=secret",
                                   "--http-restricted-api", "statistics:admin-key=admin",
                                   "--grpc-restricted-protocol", "inference:infer-key=secret")).wait_ready()
    yield s
    s.stop()


def _http_infer(url: str, headers: dict[str, str] | None) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1, 2], np.float32))
    try:
        return client.infer("identity", [inp], headers=headers).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_http_restricted_categories_need_the_header(server: ServerProcess) -> None:
    for headers in (None, {"infer-key": "wrong"}, {"other": "secret"}):
        with pytest.raises(InferenceServerException) as e:
            _http_infer(server.url, headers)
        assert e.value.status() == "403" and e.value.message() == REFUSED
    assert _http_infer(server.url, {"infer-key": "secret"}).tolist() == [1, 2]
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_ready() and client.is_model_ready("identity")  # health is not restricted
    with pytest.raises(InferenceServerException, match=REFUSED):
        client.get_model_repository_index()
    assert client.get_model_repository_index(headers={"infer-key": "secret"})
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.get_inference_statistics("identity")
    assert client.get_inference_statistics("identity", headers={"admin-key": "admin"})
    client.close()


def test_the_status_json_needs_what_statistics_and_the_repository_need(server: ServerProcess) -> None:
    """/status.json shows statistics and every model's state and load error: it was in no category, so
    restricting those left it open (review finding 6). It needs both headers here; the page itself is static."""
    def get(path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://{server.url}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    for headers, words in (({}, "admin-key"), ({"admin-key": "admin"}, "infer-key"),
                           ({"infer-key": "secret"}, "admin-key")):
        status, body = get("/status.json", headers)
        assert status == 403 and words in json.loads(body)["error"], (headers, body)
    status, body = get("/status.json", {"admin-key": "admin", "infer-key": "secret"})
    assert status == 200 and "identity" in body.decode()
    assert get("/status", {})[0] == 200


def test_grpc_restricted_protocol_answers_unavailable(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1, 2], np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity", [inp])
    assert e.value.status() == "StatusCode.UNAVAILABLE" and e.value.message() == REFUSED
    assert client.infer("identity", [inp], headers={"infer-key": "secret"}).as_numpy("OUTPUT0").tolist() == [1, 2]
    assert client.get_model_repository_index()  # only inference is restricted on gRPC
    assert client.get_inference_statistics("identity")
    client.close()


@pytest.mark.parametrize("spec", ["inference", "inference:key", "bogus:k=v", "inference,inference:k=v", ":k=v"])
def test_a_malformed_restriction_stops_the_server(tmp_path: Path, spec: str) -> None:
    s = ServerProcess(tmp_path, flags=("--http-restricted-api", spec))
    assert s.wait_exit(30) != 0
    assert "--http-restricted-api" in s.log() or "restricted API" in s.log()

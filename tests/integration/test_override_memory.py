"""What a large config override leaves behind once its model loaded (issue 23's degraded case): the
override's text and its parses are freed, and their pages go back to the system (the data plane trims
glibc's heap after such a load), over gRPC as over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model

OVERRIDE_MIB = 3.9  # under repository/overrides.MAX_CONFIG_BYTES (4 MiB)


def _rss_kb(server: ServerProcess) -> int:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_large_override_leaves_little_once_loaded(tmp_path: Path, start_server, protocol: str) -> None:
    add_model(tmp_path, "warm", IDENTITY_CONFIG, IDENTITY_PY)  # loaded first: the backend's imports are done
    add_model(tmp_path, "plain", IDENTITY_CONFIG, IDENTITY_PY)
    server = start_server(tmp_path, flags=("--model-control-mode=explicit", "--load-model=warm"))
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "parameters": {"filler": {"string_value": "x" * int(OVERRIDE_MIB * 2**20)}}})
    idle_kb = _rss_kb(server)
    if protocol == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
    else:
        client = httpclient.InferenceServerClient(server.url)
    try:
        client.load_model("plain", config=config)
        assert client.is_model_ready("plain")
    finally:
        client.close()
    held = (_rss_kb(server) - idle_kb) * 1024 / len(config)
    # the served config holds the override once and the instance's JSON of it once (about 1.7x measured);
    # before the trim glibc kept the freed copies too: 3.2x over gRPC, where its threshold had risen
    assert held < 2.5, f"{held:.1f}x the override held once loaded"

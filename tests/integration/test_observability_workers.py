"""Traces and the status page under several worker processes (a real gunicorn arbiter): the status page
shows the host's totals from any worker, trace settings reach every worker, trace files stay apart."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pid_infer, pids_seen
from .server import add_model

pytestmark = pytest.mark.timeout(240)


def _status(url: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/status.json", timeout=30) as answer:
        return json.loads(answer.read())


def test_status_totals_and_traces_across_workers(tmp_path: Path) -> None:
    add_model(tmp_path / "repo", "pid", PID_CONFIG, PID_PY)
    trace_file = tmp_path / "trace.json"
    g = Gunicorn("--model-repository", str(tmp_path / "repo"), "--trace-config", "level=TIMESTAMPS",
                 "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}", workers=2)
    try:
        workers = set(g.wait_serving(2))
        assert pids_seen(g.url, workers) == workers
        before = _status(g.url)["success"]
        for _ in range(30):
            pid_infer(g.url)  # fresh connections: both workers answer some
        for _ in range(6):  # any worker answers with the host's totals
            st = _status(g.url)
            (row,) = st["versions"]
            assert (st["workers"], st["success"], row["success"], row["workers"]) == (2, before + 30, before + 30, 2)
            assert len(row["instances"]) == 2 and row["latency_ms"]["p50"] > 0
        client = httpclient.InferenceServerClient(g.url)
        client.update_trace_settings(settings={"trace_level": ["OFF"]})  # host-wide: no worker traces any more
        client.close()
        for _ in range(10):
            pid_infer(g.url)
    finally:
        assert g.stop() == 0
    files = sorted(tmp_path.glob("trace.json.worker*"))
    assert len(files) == 2 and not trace_file.exists()
    ids = [e["id"] for f in files for e in json.loads(f.read_text()) if "model_name" in e]
    assert len(ids) == len(set(ids)) == before + 30  # every request traced once, ids unique host-wide

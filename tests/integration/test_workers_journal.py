"""The workers' journal holds desired state only: what a client asks that changes nothing is not kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pids_seen
from .server import add_model

pytestmark = pytest.mark.timeout(240)

UNKNOWN_UNLOADS = 20
NAME_BYTES = 1024 * 1024  # the probe's names: 62 of them made a 146 MB journal


def _journal(run_root: Path) -> Path:
    (run_dir,) = run_root.glob("triton-actor-*")  # the arbiter's mkdtemp, under TMPDIR
    return run_dir / "journal.json"


def _ready_everywhere(url: str, model: str, workers: set[int]) -> bool:
    """Whether ``model`` is ready on every worker: it answers from each (the pid model tells which)."""
    return pids_seen(url, workers, model=model) == workers


def test_unloads_of_unknown_models_leave_the_journal_alone_and_changes_still_reach_every_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "pid", PID_CONFIG, PID_PY)
    add_model(repo, "extra", PID_CONFIG, PID_PY)
    run_root = tmp_path / "run"
    run_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(run_root))
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "pid",
                 workers=2)
    try:
        workers = set(g.wait_serving(2))
        grpc = grpcclient.InferenceServerClient(g.grpc_url)
        http = httpclient.InferenceServerClient(g.url)
        try:
            for i in range(UNKNOWN_UNLOADS):
                grpc.unload_model(f"{i:04d}".ljust(NAME_BYTES, "x"))  # Triton: success, nothing to unload
            journal = _journal(run_root)
            assert not journal.exists() or journal.stat().st_size < 4096, journal.stat().st_size
            http.load_model("extra")  # a real change still reaches every worker, and is kept
            assert _ready_everywhere(g.url, "extra", workers)
            http.unload_model("extra")
            assert not http.is_model_ready("extra")
            http.load_model("extra")
            kept = journal.read_bytes()
            assert kept.count(b'"model:extra"') == 1 and b"xxxx" not in kept, kept[:200]
        finally:
            grpc.close()
            http.close()
    finally:
        assert g.stop() == 0

"""POLL mode when the repository folder itself is deleted: the server keeps answering, its watcher does
not spin on warnings, and it still stops cleanly on SIGTERM (it hung there while threads were patched)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model

pytestmark = pytest.mark.timeout(90)


def test_a_deleted_repository_folder_neither_floods_the_log_nor_blocks_shutdown(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    server = ServerProcess(repo, flags=("--model-control-mode", "poll", "--repository-poll-secs", "60")).wait_ready()
    try:
        shutil.rmtree(repo)
        client = httpclient.InferenceServerClient(server.url)
        for _ in range(50):  # the server goes on answering while its watcher sees the folder vanish
            assert client.is_server_live()
        client.close()
    finally:
        code = server.stop(signal.SIGTERM, timeout=30)
    assert code == 0, server.log()
    assert server.log().count("called when the thread is inactive") < 3

"""The workers' control sockets (workers/control.py) under a run folder whose path is longer than a Unix
socket's address can hold (108 bytes on Linux): a worker bound there failed to start ("AF_UNIX path too
long"), which a TMPDIR of some 60 characters was enough for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_actor.workers import control


@pytest.mark.timeout(30)
def test_a_socket_whose_path_is_too_long_for_an_address_serves_and_is_reached(tmp_path: Path) -> None:
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o700)
    path = str(folder / "12345.sock")
    assert len(os.fsencode(path)) > control.SUN_PATH_MAX
    server = control.ControlServer(path, lambda kind, args: {"kind": kind, **args})
    server.start()
    try:
        assert os.path.exists(path) and (os.stat(path).st_mode & 0o777) == 0o600  # the file is where it was asked
        assert control.call(path, "echo", {"x": 1}, timeout=10) == {"kind": "echo", "x": 1}
    finally:
        server.stop()
    assert not os.path.exists(path)


def test_a_short_path_is_used_as_it_is(tmp_path: Path) -> None:
    with control.reachable("/tmp/x.sock") as name:
        assert name == "/tmp/x.sock"

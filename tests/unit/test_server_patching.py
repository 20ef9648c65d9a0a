"""The bridge and actor tests run under the server's own patching, not only under the test process's.

The server's bootstrap leaves ``threading``, ``queue`` and ``select`` native (bootstrap.py says why); this
test process patches them too, for tritonclient's gRPC client (tests/conftest.py). What the thread
bridge and the actors do with native threads can differ between the two: a Python model's asyncio loop
thread works only with ``threading`` native (tests/unit/runtime/test_loop_thread.py), and a test that
started a "thread" got a greenlet here and a native thread in the server. So a child pytest, with
TRITON_ACTOR_TEST_PATCHING=server (the conftest then patches exactly as the server does), runs
tests/unit/runtime and tests/unit/actors, the tests marked ``server_patching`` among them; the fast-path
switch (TRITON_ACTOR_FAST_PATHS) is passed on, so the suite's two runs run it both ways.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tests/unit/runtime", "tests/unit/actors")


@pytest.mark.timeout(300)
def test_bridge_and_actor_tests_pass_under_the_servers_patching() -> None:
    env = {**os.environ, "TRITON_ACTOR_TEST_PATCHING": "server"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FOLDERS],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=280)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    summary = re.search(r"(\d+) passed", tail)
    assert summary is not None and int(summary.group(1)) > 100, tail
    assert "deselected" not in tail, "the child deselected tests: it was not patched as the server is"


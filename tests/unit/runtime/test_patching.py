"""The child pytest of tests/unit/test_server_patching.py is patched exactly as the server is: what the
bootstrap patches (sockets, time) and nothing more (``threading``, ``queue``, ``select`` native)."""

from __future__ import annotations

import pytest
from gevent import monkey

pytestmark = pytest.mark.server_patching


def test_the_runtime_runs_under_the_servers_patching() -> None:
    assert monkey.is_module_patched("socket") and monkey.is_module_patched("time")
    for native in ("threading", "thread", "queue", "select", "subprocess", "os", "signal"):
        assert not monkey.is_module_patched(native), f"{native} is patched; the server leaves it native"

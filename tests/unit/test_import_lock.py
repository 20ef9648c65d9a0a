"""First imports of a runtime on several native threads at once (models loading in parallel) must not hang:
with ``_thread`` patched, importlib's module locks would be gevent locks that native threads cannot share;
the bootstrap gives importlib native ones. Checked in fresh interpreters, where the runtime is not imported
yet, with a bare ``import`` as model code does it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import time
    import triton_actor.bootstrap  # noqa: F401 - patched as the server is
    import gevent
    from gevent import monkey

    start = monkey.get_original("_thread", "start_new_thread")
    done, errors = [], []

    def load():
        try:
            import onnxruntime  # as model code does it: no backend lock, only importlib's own locks
            onnxruntime.SessionOptions()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        done.append(1)

    for _ in range(8):
        start(load, ())
    deadline = time.time() + 20
    while len(done) < 8 and time.time() < deadline:
        gevent.sleep(0.02)  # native threads: polled under a deadline
    print(len(done), errors)
""")


@pytest.mark.timeout(120)
def test_eight_threads_import_onnxruntime_at_once() -> None:
    """Without the fix about one fresh interpreter in five loses the race (a KeyError from importlib's
    lock bookkeeping, the other threads hang); three tries make a regression likely to show."""
    pytest.importorskip("onnxruntime")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "8 []", out.stdout + out.stderr

"""The bootstrap patches with public gevent API only: nothing of the interpreter's own state changes
(a swap of importlib's ``_thread`` broke CPython 3.12, whose module locks need ``_thread.RLock``)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import _thread, sys
import _frozen_importlib
before = (_frozen_importlib._thread, _thread.allocate_lock, _thread.get_ident, _thread.start_new_thread)
import triton_actor.bootstrap  # noqa: F401
from gevent import monkey
assert monkey.is_module_patched("socket")
after = (_frozen_importlib._thread, _thread.allocate_lock, _thread.get_ident, _thread.start_new_thread)
assert before == after, "the bootstrap changed _thread or importlib's view of it"
assert _frozen_importlib._thread is _thread
import threading
assert not monkey.is_module_patched("threading")
print("ok")
"""

IMPORT_RACE = """
import triton_actor.bootstrap  # noqa: F401
import sys, threading, tempfile, os
d = tempfile.mkdtemp()
with open(os.path.join(d, "slowmod.py"), "w") as f:
    f.write("import time\\ntime.sleep(0.2)\\nVALUE = 42\\n")  # a slow module body: the race's window
sys.path.insert(0, d)
results = []
def first_import():
    import slowmod
    results.append(slowmod.VALUE)
threads = [threading.Thread(target=first_import) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join(20)
assert results == [42] * 4, results
print("ok")
"""


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_bootstrap_leaves_interpreter_internals_alone() -> None:
    assert _run(CHECK).strip() == "ok"


def test_first_imports_of_one_module_on_native_threads_at_once() -> None:
    # the race the old importlib swap fixed: several native threads importing one module for the first time
    assert _run(IMPORT_RACE).strip() == "ok"

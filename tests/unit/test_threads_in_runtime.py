"""Threads in one place: native threads and gevent's internals are the runtime package's alone.

The rule, for every module of ``triton_actor/`` outside ``triton_actor/runtime/`` (imports inside
functions and under ``TYPE_CHECKING`` count too):

1. It imports none of ``threading``, ``_thread``, ``queue``, ``_queue``, ``concurrent.futures``: native
   threads, their locks and their queues come from ``runtime.threads`` (``native_lock``,
   ``NativeEvent``, ``start_native_thread``, ``SerialWriter``) and ``runtime.bridge`` (``NativeWorker``,
   ``HubSignal``, ``call_in_thread``).
2. It never calls ``gevent.monkey.get_original`` (any name or attribute ``get_original``): the
   unpatched originals are taken once, in ``runtime.threads``.
3. It imports no private gevent module (``gevent._*``), and reaches neither the hub's thread pool
   (``.threadpool``) nor a cross-thread watcher (``.async_``).
4. It touches no gevent socket or hub internals: the attributes ``_sock``, ``_wait``, ``_read_event``,
   ``_write_event`` and ``cancel_wait`` of anything but ``self`` / ``cls`` (the hot path's socket calls
   live in ``runtime/socket_io.py``).

gevent's public API (``gevent.spawn``, ``gevent.event``, ``gevent.lock``, ``gevent.queue``, the loop's
timers) is everyone's: it is how greenlets on the hub talk to each other, not a way to native threads.

Excepted, by file: the code that runs only in an isolated Python model's own process
(``backends/python/isolated_child.py``, ``isolated_child_bls.py``, ``metrics_forwarding.py``; the
server imports only the last one's constants). That process is a plain Python program started with
``python -m`` (never a fork of the server, never gevent-patched, no hub): its reader thread, its BLS
cancel thread and the model's own threads are ordinary ``threading`` threads, and the runtime, built
around the server's hub, has nothing to give them. ``backends/python/child_process.py`` and
``frame_pipe.py`` are *not* excepted: the server runs them (the first is the server's view of the
process; the second is shared, and takes its lock from its caller). Likewise ``tune/loadgen.py``: the
load generator of ``triton-actor tune`` runs only as its own ``python -m`` process, never in the server's
interpreter; its gRPC open loop runs tritonclient's asyncio client on an event loop of its own thread.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "triton_actor"
RUNTIME = PACKAGE / "runtime"
CHILD_PROCESS_ONLY = {
    PACKAGE / "backends" / "python" / "isolated_child.py",
    PACKAGE / "backends" / "python" / "isolated_child_bls.py",
    PACKAGE / "backends" / "python" / "metrics_forwarding.py",
    PACKAGE / "tune" / "loadgen.py",
}
THREAD_MODULES = {"threading", "_thread", "queue", "_queue", "concurrent.futures"}
HUB_INTERNALS = {"threadpool", "async_", "get_original"}
SOCKET_INTERNALS = {"_sock", "_wait", "_read_event", "_write_event", "cancel_wait"}


def _forbidden_module(name: str) -> bool:
    if name in THREAD_MODULES or name.startswith("concurrent.futures."):
        return True
    parts = name.split(".")
    return parts[0] == "gevent" and any(p.startswith("_") for p in parts[1:])


def violations(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each use the rule forbids in one module's syntax tree."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _forbidden_module(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if _forbidden_module(node.module) or _forbidden_module(f"{node.module}.{alias.name}") \
                        or alias.name == "get_original":
                    yield node.lineno, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in HUB_INTERNALS:
                yield node.lineno, f".{node.attr}"
            elif node.attr in SOCKET_INTERNALS and owner not in ("self", "cls"):
                yield node.lineno, f".{node.attr} (a gevent socket/hub internal)"
        elif isinstance(node, ast.Name) and node.id == "get_original":
            yield node.lineno, "get_original"


def _modules() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_generated" in path.parts or path.is_relative_to(RUNTIME) or path in CHILD_PROCESS_ONLY:
            continue
        yield path


def test_only_the_runtime_touches_threads_or_gevent_internals() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
             for path in _modules()
             for line, what in violations(ast.parse(path.read_text(), str(path)))]
    assert not found, "native threads or gevent internals outside triton_actor/runtime/ " \
                      "(use runtime.threads / runtime.bridge; the rule is in this test's docstring):\n" + "\n".join(found)


def test_the_excepted_files_exist_and_the_walk_sees_the_package() -> None:
    """An excepted file that moved or was renamed must be looked at again, not silently excepted."""
    assert all(path.is_file() for path in CHILD_PROCESS_ONLY), CHILD_PROCESS_ONLY
    assert len(list(_modules())) > 100


def test_the_walk_names_each_kind_of_use() -> None:
    source = (
        "import threading\n"
        "from _thread import allocate_lock\n"
        "import concurrent.futures\n"
        "from gevent._hub_local import get_hub_if_exists\n"
        "from gevent import monkey\n"
        "lock = monkey.get_original('_thread', 'allocate_lock')\n"
        "pool = gevent.get_hub().threadpool\n"
        "sock._wait(sock._read_event)\n"
        "self._read_event(sock)\n"
        "def f():\n"
        "    import queue\n"
    )
    found = list(violations(ast.parse(source)))
    lines = sorted({line for line, _what in found})
    assert lines == [1, 2, 3, 4, 6, 7, 8, 11], found
    assert not [what for line, what in found if line == 9]  # an own method of that name is fine

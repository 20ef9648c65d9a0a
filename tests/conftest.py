"""Test-wide setup: the process is gevent-patched first, ``threading`` too (for the gRPC client), unless
TRITON_ACTOR_TEST_PATCHING=server asks for exactly the server's own patching (bootstrap.py)."""

import importlib.util
import os

import pytest

# Before grpc is imported: the harness forks servers while tritonclient's gRPC channels are open;
# with grpcio's fork support on, a forked child can crash before exec (https://github.com/grpc/grpc/issues/43055).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The test process is a gRPC *client* under gevent: tritonclient's streams and callbacks run on
# grpcio's own threads, which the patching turned into greenlets; grpcio's documented gevent
# integration makes them cooperative. (The server never calls this: it serves gRPC on its own HTTP/2
# in hub greenlets, triton_actor/frontends/grpc_h2.py; it always runs in a subprocess here.)
# grpcio's gevent integration needs ``threading`` patched too, which the server's bootstrap leaves
# native (its docstring says why): the test process patches it before the bootstrap, whose own patching
# then sees the work done. In-process model loads still import under backends.base.IMPORT_LOCK.
#
# TRITON_ACTOR_TEST_PATCHING=server patches exactly as the server does (the bootstrap alone, threading
# native) and sets up no gRPC client: tests/unit/test_server_patching.py runs the bridge and actor tests
# (tests/unit/runtime, tests/unit/actors) that way in a child pytest, so what they check holds under the
# patching the server runs with, not only under the client's.
SERVER_PATCHING = os.environ.get("TRITON_ACTOR_TEST_PATCHING") == "server"
if not SERVER_PATCHING:
    from gevent import monkey
    from grpc.experimental import gevent as grpc_gevent

    monkey.patch_all(subprocess=False, os=False, signal=False)

import triton_actor.bootstrap  # noqa: E402, F401

if not SERVER_PATCHING:
    grpc_gevent.init_gevent()

# torch's import runs `ldconfig` through the stdlib subprocess (ctypes.util.find_library). Once the
# harness has started a server with gevent.subprocess, gevent's SIGCHLD reaper takes that child's
# exit status and the import hangs in waitpid; importing torch here, before any child exists, avoids it.
if importlib.util.find_spec("torch") is not None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``server_patching`` hold only where ``threading`` is native: in this process (patched
    for the gRPC client) they are deselected (pytest counts them), and the child pytest of
    tests/unit/test_server_patching.py runs them."""
    if SERVER_PATCHING:
        return
    dropped = [item for item in items if item.get_closest_marker("server_patching") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("server_patching") is None]

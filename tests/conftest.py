"""Test-wide setup: the process is gevent-patched first, as the server's own bootstrap does."""

import importlib.util
import os

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
from gevent import monkey
from grpc.experimental import gevent as grpc_gevent

monkey.patch_all(subprocess=False, os=False, signal=False)

import triton_actor.bootstrap  # noqa: E402, F401

grpc_gevent.init_gevent()

# torch's import runs `ldconfig` through the stdlib subprocess (ctypes.util.find_library). Once the
# harness has started a server with gevent.subprocess, gevent's SIGCHLD reaper takes that child's
# exit status and the import hangs in waitpid; importing torch here, before any child exists, avoids it.
if importlib.util.find_spec("torch") is not None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

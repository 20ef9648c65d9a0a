"""Test-wide setup: the process is gevent-patched first, as the server's own bootstrap does."""

import importlib.util
import os

# Before grpc is imported: the harness forks servers while tritonclient's gRPC channels are open;
# with grpcio's fork support on, a forked child can crash before exec (grpc/grpc#43055).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The test process is a gRPC *client* under gevent: tritonclient's streams and callbacks run on
# grpcio's own threads, which the patching turned into greenlets; grpcio's documented gevent
# integration makes them cooperative. (The server never calls this: it serves gRPC on its own HTTP/2
# in hub greenlets, triton_actor/frontends/grpc_h2.py; it always runs in a subprocess here.)
from grpc.experimental import gevent as grpc_gevent

import triton_actor.bootstrap  # noqa: F401

grpc_gevent.init_gevent()

# torch's import runs `ldconfig` through the stdlib subprocess (ctypes.util.find_library). Once the
# harness has started a server with gevent.subprocess, gevent's SIGCHLD reaper takes that child's
# exit status and the import hangs in waitpid; importing torch here, before any child exists, avoids it.
if importlib.util.find_spec("torch") is not None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

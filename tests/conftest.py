"""Test-wide setup: the process is gevent-patched first, as the server's own bootstrap does."""

import importlib.util

import triton_actor.bootstrap  # noqa: F401

# torch's import runs `ldconfig` through the stdlib subprocess (ctypes.util.find_library). Once the
# harness has started a server with gevent.subprocess, gevent's SIGCHLD reaper takes that child's
# exit status and the import hangs in waitpid; importing torch here, before any child exists, avoids it.
if importlib.util.find_spec("torch") is not None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

"""Test-wide setup: the process is gevent-patched first, as the server's own bootstrap does."""

import triton_actor.bootstrap  # noqa: F401

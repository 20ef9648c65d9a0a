"""Process bootstrap: gevent monkey-patching, done once, before anything else imports.

The CLI, the gunicorn config and the tests import this module first. ``subprocess``, ``os`` and
``signal`` stay as the standard library has them: gevent's subprocess only works on the hub's
(default) loop, but model code runs on instance threads and does spawn processes (``import torch``
runs ``ldconfig`` through ``ctypes.util.find_library``; a ``model.py`` may call ``subprocess.run``),
and with ``os`` patched (gevent's fork/waitpid) the stdlib subprocess hangs on its second
``capture_output`` call; gevent patches ``signal`` only together with ``os``. The hub never spawns
processes; SIGINT/SIGTERM go through ``gevent.signal_handler``.

``queue`` IS patched: with ``threading`` patched, ``concurrent.futures`` (used by model code) runs
its workers as greenlets, and an unpatched queue would block the hub. (feasibility's watchdog note
asks for ``queue=False``; POLL mode runs watchdog's inotify emitter, without its Observer, on a
native thread of its own instead: ``actors/watcher.py``.) The thread bridge uses the C ``_queue`` module directly.
"""

from __future__ import annotations

import os
import types

from gevent import monkey

# grpcio >= 1.80 with fork support on restarts its epoll poller in a forked child, which crashes when
# the child closes descriptors before exec (grpc/grpc#43055): a model's subprocess (torch's ldconfig,
# a model.py's subprocess.run) could die before it ran. We never fork to keep using gRPC in a child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if not monkey.is_module_patched("socket"):
    # importlib's per-module import locks come from ``_thread``, which the patching turns into gevent
    # locks: native threads (model instances loading in parallel) cannot share those, and two first
    # imports of one module on two load threads failed or hung. importlib keeps the native primitives,
    # bound before patching so that imports already in progress (this one) stay consistent. Greenlets
    # of one thread then share an import-lock owner, as in an unpatched interpreter; an import that
    # yields to another greenlet half-way is the (rare) case this trades away.
    import _frozen_importlib
    import _thread

    _native_ident = _thread.get_ident
    _frozen_importlib._thread = types.SimpleNamespace(allocate_lock=_thread.allocate_lock, get_ident=_native_ident)

    monkey.patch_all(subprocess=False, os=False, signal=False)

    # gevent re-owned the import locks held right now (this import's) by its greenlet ids; give them back
    import gc

    for _lock in gc.get_objects():
        if isinstance(_lock, _frozen_importlib._ModuleLock) and _lock.owner is not None:
            _lock.owner = _native_ident()

PATCHED = True

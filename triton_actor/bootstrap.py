"""Process bootstrap: gevent monkey-patching, done once, before anything else imports.

The CLI, the gunicorn worker and the tests import this module first. It uses public gevent API only and
touches no interpreter internals (supported: CPython 3.10-3.13).

What is patched: ``socket``, ``ssl``, ``time`` and the rest of ``patch_all``'s defaults, so
the hub's I/O cooperates. What is **not**:

* ``thread`` / ``threading`` / ``queue`` / ``select`` stay native (a native thread waiting on a gevent
  queue that another thread fills never wakes: ``concurrent.futures`` in model code needs both native;
  watchdog's inotify reader is a native thread that polls with ``select.poll``, which patched raises
  ``LoopExit`` in a thread without a running hub). The hub itself waits on sockets through gevent. Model instances run on native threads (thread-per-instance, the
  thread bridge in ``runtime/bridge.py``), model code starts threads of its own (a ``ThreadPoolExecutor``
  in ``initialize``), POLL's inotify emitter runs on one, and importlib's per-module import locks come from
  ``_thread``: with ``_thread`` patched those locks are gevent locks that native threads loading models in
  parallel cannot share (first imports of one module on two load threads failed or hung). Native
  ``threading`` keeps all of these correct without reaching into importlib (which an earlier version
  did, and which broke on 3.12). The hub's own code never blocks on a ``threading`` primitive: actors use
  gevent queues and events, and native threads meet the hub only through the bridge.
* ``subprocess``, ``os`` and ``signal``: gevent's subprocess only works on the hub's (default) loop, but
  model code runs on instance threads and does spawn processes (``import torch`` runs ``ldconfig``; a
  ``model.py`` may call ``subprocess.run``), and with ``os`` patched (gevent's fork/waitpid) the stdlib
  subprocess hangs on its second ``capture_output`` call; gevent patches ``signal`` only together with
  ``os``. The hub never spawns processes; SIGINT/SIGTERM go through ``gevent.signal_handler``.
"""

from __future__ import annotations

import os

from gevent import monkey

# grpcio >= 1.80 with fork support on restarts its epoll poller in a forked child, which crashes when
# the child closes descriptors before exec (https://github.com/grpc/grpc/issues/43055): a model's subprocess (torch's ldconfig,
# a model.py's subprocess.run) could die before it ran. We never fork to keep using gRPC in a child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if not monkey.is_module_patched("socket"):
    monkey.patch_all(thread=False, threading=False, queue=False, select=False, subprocess=False, os=False,
                     signal=False)

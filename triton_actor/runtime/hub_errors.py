"""Only a signal ends the server: a greenlet that raises SystemExit or KeyboardInterrupt is logged.

gevent's hub treats both as *system* errors: raised in any greenlet, they are thrown into the main
greenlet, and the process exits. The server's own greenlets never end that way (it stops on SIGTERM /
SIGINT through ``Server.stop``, and our gunicorn worker's quit only ends its serving loop), so such a
greenlet is model code: a Python model promoted to run on the hub (``actors/scheduling/instance.py``) that spawned
a greenlet calling ``sys.exit()``. Like the model's own exceptions, it is logged, and the server keeps
serving (models on their own thread have their own hub, where ``runtime/bridge.py`` does the same).
Exceptions raised by the event loop itself (a signal handler, a callback) keep gevent's handling.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import gevent
from gevent.hub import Hub

log = logging.getLogger(__name__)

_ENDS_GREENLET_ONLY = (SystemExit, KeyboardInterrupt)


def install(hub: Hub | None = None) -> None:
    """Guard ``hub`` (this thread's) once: its ``handle_error`` logs a greenlet's SystemExit instead."""
    hub = hub or gevent.get_hub()
    if getattr(hub, "_triton_actor_guarded", False):
        return
    default = hub.handle_error

    def handle_error(context: Any, type_: type[BaseException] | None, value: BaseException | None,
                     tb: TracebackType | None) -> None:
        if isinstance(context, gevent.Greenlet) and type_ is not None and issubclass(type_, _ENDS_GREENLET_ONLY):
            log.error("greenlet %r raised %s(%s): ignored (only a signal stops the server)", context,
                      type_.__name__, value)
            return
        default(context, type_, value, tb)

    hub.handle_error = handle_error
    hub._triton_actor_guarded = True

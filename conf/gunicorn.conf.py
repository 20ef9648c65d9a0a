"""gunicorn configuration for triton_actor: N worker processes serving the same HTTP and gRPC ports.

    TRITON_ACTOR_ARGS="--model-repository model_repository" gunicorn -c conf/gunicorn.conf.py

``TRITON_ACTOR_ARGS`` holds the ``triton-actor`` flags every worker runs with (ports and addresses are read
from them to bind here, in the arbiter); ``TRITON_ACTOR_WORKERS`` the number of workers (default: 2).
``triton-actor --workers N ...`` is the short form of the same. Signals are gunicorn's: HUP replaces the
workers one at a time, TERM drains and stops, TTIN / TTOU add / remove a worker, a worker that dies is
replaced. What is host-wide and who owns it: ``triton_actor/workers/__init__.py``.
"""

import os
import shlex

from triton_actor.config.command_line import parse
from triton_actor.workers.arbiter import gunicorn_options

_argv = shlex.split(os.environ.get("TRITON_ACTOR_ARGS", "--model-repository model_repository"))
_settings = parse([*_argv, "--workers", os.environ.get("TRITON_ACTOR_WORKERS", "2")])
globals().update(gunicorn_options(_settings, _argv))
wsgi_app = "triton_actor.workers.gunicorn_worker:unused_app"  # required by gunicorn; not served

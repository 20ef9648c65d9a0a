"""``triton-actor`` / ``python -m triton_actor``: the entry point. The command line becomes Settings
(``config/command_line.py``); one process runs the server, ``--workers N`` gunicorn's arbiter.
``triton-actor check REPOSITORY`` checks a repository instead (``check/``), ``triton-actor tune ...`` runs the
tuner (``tune/``); tritonserver's command line has no positional arguments, so a first argument ``check`` or
``tune`` cannot be one of its flags."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .config.command_line import configure_logging, log_ignored_flags, parse
from .runtime import fastpath


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        _check(argv[1:])
    if argv[:1] == ["tune"]:  # a subcommand only as the first word: tritonserver's flags all start with "--"
        from .tune.command import main as tune

        sys.exit(tune(argv[1:]))
    settings = parse(argv)
    if settings.workers > 1:  # gunicorn's arbiter, unpatched; each worker patches after the fork
        from .workers import arbiter

        arbiter.run(settings, argv)
        sys.exit(0)
    from . import bootstrap  # noqa: F401 - patch before the server's modules import gevent-sensitive stuff

    fastpath.set_enabled(settings.fast_paths)
    configure_logging(settings)
    log_ignored_flags(settings)
    from .server import Server

    code = Server(settings).run()
    # Models are drained and finalized by now. Leave without the interpreter's exit handlers: they
    # would join threads that model code started (e.g. a ThreadPoolExecutor made in initialize()),
    # which can wait forever once their instance thread is gone. Triton kills its stubs likewise.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check(argv: list[str]) -> NoReturn:
    """``triton-actor check``: its exit status is the process's."""
    from .check.command import main as check

    code = check(argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the server does: threads that model code started must not hold the exit

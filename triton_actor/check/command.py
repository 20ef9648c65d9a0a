"""``triton-actor check REPOSITORY... [--strict] [--json] [--jobs N] [--timeout S]``: the checker's parent.

Each model is loaded in a child process of its own (``python -m triton_actor check --one NAME``, see
``one_model.py``), at most ``--jobs`` at a time, each in greenlets of this process's hub (gevent's
subprocess: no thread). A child that dies, exits or overruns ``--timeout`` (its process group is killed)
fails only its model. One line per model is printed as it finishes (to stderr with ``--json``, whose
document goes to stdout). Exit status: 0 when no model failed, 1 when one did, 2 for a bad command line
or a repository without models.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import gevent.pool
from gevent import subprocess

from ..backends.devices import gpu_count
from ..errors import TritonError
from ..repository import config as config_mod
from ..repository import layout
from . import report, static
from .report import Failure, ModelResult

_LOG_TAIL = 20  # lines of a dead child's log kept in its error


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-actor check", description="Load every model of a repository in "
                                "a process of its own, serve it one request, and report what failed.")
    p.add_argument("repositories", nargs="+", metavar="REPOSITORY", help="model repository folder(s)")
    p.add_argument("--strict", action="store_true", help="warnings (what will fail only elsewhere) fail too")
    p.add_argument("--json", action="store_true", help="print a JSON document on stdout (lines go to stderr)")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="models checked at once")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one model may take to load and answer")
    p.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # the child: check this model only
    p.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--on-cpu", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.one:
        from .. import bootstrap  # noqa: F401 - the child serves: patch before the server's modules import
        from .one_model import run  # the child imports the server; the parent never does

        return run(args.one, args.repositories, args.report, args.on_cpu)
    given = list(args.repositories)
    models = layout.list_models([Path(r) for r in given])
    if not models:
        print(f"triton-actor check: no models in {', '.join(args.repositories)}", file=sys.stderr)
        return 2
    args.repositories = [str(Path(r).resolve()) for r in args.repositories]  # the children's, and frames'
    out = sys.stderr if args.json else sys.stdout
    width = max(map(len, models))
    results: list[ModelResult] = []
    gpus = gpu_count()
    with tempfile.TemporaryDirectory(prefix="triton_actor_check_") as scratch:
        def one(name: str) -> None:
            result = check_model(name, models[name], args, gpus, Path(scratch) / f"{name}.json").settle(args.strict)
            results.append(result)
            print(report.line(result, width), file=out, flush=True)

        pool = gevent.pool.Pool(max(1, args.jobs))
        for name in sorted(models):
            pool.spawn(one, name)
        pool.join(raise_error=True)
    print(report.summary(results), file=out, flush=True)
    if args.json:
        print(json.dumps(report.document(given, args.strict, results), indent=2))
    return 0 if all(r.status != report.FAIL for r in results) else 1


def check_model(name: str, folders: list[Path], args: argparse.Namespace, gpus: int, report_file: Path) -> ModelResult:
    """Static warnings, then the child's load and request (this greenlet waits for it)."""
    warnings: list[str] = []
    on_cpu = False
    try:
        cfg, _ = config_mod.read(folders[0], name, auto_complete=True)
        versions = layout.list_versions(folders[0])
        config_mod.fill_backend_fields(cfg, name, versions[min(versions)] if versions else None)
        warnings = static.warnings(cfg, folders[0], gpus)
        on_cpu = gpus == 0 and bool(static.gpu_groups(cfg))
    except (TritonError, OSError):
        pass  # the child's load reports it, in the server's words
    result = _run_child(name, args, report_file, on_cpu)
    result.warnings = warnings + result.warnings
    return result


def _run_child(name: str, args: argparse.Namespace, report_file: Path, on_cpu: bool) -> ModelResult:
    command = [sys.executable, "-m", "triton_actor", "check", "--one", name, "--report", str(report_file),
               *(["--on-cpu"] if on_cpu else []), *args.repositories]
    # its own session: a timeout kills the model's processes (isolated instances) along with it
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        log, _ = child.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child.pid)
        log, _ = child.communicate()
        return ModelResult(name, error=Failure(f"model '{name}' did not load and answer within {args.timeout:g} s "
                                               "(--timeout); its process was killed"))
    _kill_group(child.pid)  # what a crashed child leaves behind (an isolated model's process)
    try:
        return _from_report(json.loads(report_file.read_text()))
    except (OSError, ValueError, TypeError):  # none (it died), or cut short by the death
        return ModelResult(name, error=_death(name, child.returncode, log, args.repositories))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _from_report(data: dict) -> ModelResult:
    error = data.pop("error")
    data.pop("status", None)
    return ModelResult(**data, error=Failure(**error) if error else None)


def _death(name: str, status: int, log: str, roots: Sequence[str]) -> Failure:
    """A child that ended without a report: a signal (a crash) or an exit status, with its last log lines
    and the model frame faulthandler printed, where it printed one."""
    how = (f"was killed by {signal.Signals(-status).name} (a crash in native code)" if status < 0
           else f"exited with status {status} (model code ended the process)")
    tail = "\n".join(_crash_report(log.splitlines()) or log.splitlines()[-_LOG_TAIL:])
    failure = Failure.from_text(tail, roots)
    return Failure(f"model '{name}': the process loading it {how}"
                   + (f"; its last log lines:\n{tail}" if tail else ""), failure.file, failure.line)


def _crash_report(lines: list[str]) -> list[str]:
    """faulthandler's report of the thread that crashed (its first block), without the other threads."""
    start = next((i for i, text in enumerate(lines) if text.startswith("Fatal Python error")), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("Thread 0x", "Extension modules"))),
               len(lines))
    return [text for text in lines[start:end] if text.strip()]

"""How a Python model's ``model.py`` is imported: a fresh package per instance, its ``sys.path`` entries
counted, its helper modules given back at unload, and Triton's text for an error in model code.

Each instance imports its own copy of the module (Triton instances never share Python state), as a
package whose ``__path__`` is the version folder, so relative imports inside the version folder work
(Triton imports ``<version>.model`` with the model and version folders on ``sys.path``; we add those
too). Owner: this module (``_sequence``, ``_path_users``, ``_held``, under the backends' import lock).
Failure: an import error becomes ``TritonError`` (INTERNAL, with the stub's text); nothing is left
registered.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback
import types
from pathlib import Path

from ...errors import TritonError
from ...repository.layout import model_file
from ...repository.public_paths import PublicPaths, public_text
from ..base import IMPORT_LOCK
from .stub_argv import as_stub

_ROOT_PACKAGE = "triton_actor_models"
_OWN_DIR = str(Path(__file__).resolve().parents[2])  # the triton_actor package
_sequence = 0
# What model code raises that is the model's own error: any Exception, and the two BaseExceptions a
# model raises on purpose, sys.exit() and an interrupt (Triton's stub reports them like any other
# Python error). Left to propagate, they would reach gevent's hub, which re-raises them in the main
# greenlet and ends the server (docs/testing.md#faults-and-soak). GreenletExit, gevent.Timeout and RunOnThread
# are not the model's: they pass through.
MODEL_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


# What each imported model package holds, so unloading gives it back: its sys.path entries (shared
# entries are counted) and the top-level modules it imported from its own folders (``import utils``).
# Imports run on instance threads, several at once: the backends' import lock serializes them.
_lock = IMPORT_LOCK  # also keeps model.py imports on different threads from racing (see base.py)
_path_users: dict[str, int] = {}
_held: dict[str, tuple[list[str], list[str]]] = {}  # package → (sys.path entries, owned top-level modules)


def _fresh_package(model: str, version_dir: Path, tag: str) -> str:
    """Register a new package whose path is ``version_dir``; return its dotted name. Call with ``_lock`` held."""
    global _sequence
    _sequence += 1
    if _ROOT_PACKAGE not in sys.modules:
        root = types.ModuleType(_ROOT_PACKAGE)
        root.__path__ = []
        sys.modules[_ROOT_PACKAGE] = root
    safe = re.sub(r"\W", "_", model)
    name = f"{_ROOT_PACKAGE}.{safe}_{tag}_{_sequence}"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(version_dir)]
    pkg.__file__ = str(version_dir / "__init__.py")
    sys.modules[name] = pkg
    paths = []
    for extra in (str(version_dir), str(version_dir.parent)):
        if extra in _path_users:
            _path_users[extra] += 1
        elif extra in sys.path:
            continue  # not ours to count or remove
        else:
            sys.path.append(extra)
            _path_users[extra] = 1
        paths.append(extra)
    _held[name] = (paths, [])
    return name


def _inside(path: object, folder: str) -> bool:
    return isinstance(path, str) and (path == folder or path.startswith(folder + os.sep))


def forget_package(package: str) -> None:
    """Unload bookkeeping of one imported model: its modules leave sys.modules and the sys.path entries
    nobody else uses go, so unloaded versions are freed and a reload imports its helpers afresh."""
    with _lock:
        paths, owned = _held.pop(package, ([], []))
        for name in [n for n in list(sys.modules) if n == package or n.startswith(package + ".")] + owned:
            sys.modules.pop(name, None)
        for extra in paths:
            _path_users[extra] -= 1
            if not _path_users[extra]:
                del _path_users[extra]
                if extra in sys.path:
                    sys.path.remove(extra)


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Compiles ``model.py`` from its source every time. The ``__pycache__`` check compares the source's
    mtime in whole seconds and its size, so a file rewritten within the same second at the same size
    (a hot reload) would otherwise run the previous code."""

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def import_model(model: str, version_dir: Path, filename: str, tag: str) -> types.ModuleType:
    """Import ``<version_dir>/<filename>`` as a fresh module; errors become INVALID_ARG with the traceback."""
    path = model_file(model, version_dir, filename, "python model file")
    folder = str(version_dir.parent)
    with _lock:
        package = _fresh_package(model, version_dir, tag)
        name = f"{package}.{Path(filename).stem}"
        spec = importlib.util.spec_from_file_location(name, path, loader=_SourceLoader(name, str(path)))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        # helpers (``import utils``) resolve afresh from this model's folders, ahead of other models'
        # same-named files: modules cached from any model folder step aside during the import and come
        # back afterwards unless this import replaced them
        folders = [folder, *_path_users]
        # (list(...) snapshots in one step: other threads may be importing while this one looks)
        stashed = {n: m for n, m in list(sys.modules.items()) if not n.startswith(_ROOT_PACKAGE)
                   and any(_inside(getattr(m, "__file__", None), f) for f in folders)}
        for cached in stashed:
            del sys.modules[cached]
        before = set(sys.modules)
        sys.path[:0] = [str(version_dir), folder]
        try:
            with as_stub():
                spec.loader.exec_module(module)
            error = None
        except MODEL_ERRORS as e:
            error = e
        finally:
            for entry in (str(version_dir), folder):  # by value: model code may have changed sys.path too
                sys.path.remove(entry)
            _held[package][1].extend(n for n in set(sys.modules) - before
                                     if _inside(getattr(sys.modules.get(n), "__file__", None), folder)
                                     and not n.startswith(_ROOT_PACKAGE))
            for cached, cached_module in stashed.items():
                sys.modules.setdefault(cached, cached_module)
    if error is not None:
        forget_package(package)
        raise TritonError.internal(f"failed to load model '{model}': {python_error_text(error)}") from None
    if not hasattr(module, "TritonPythonModel"):
        forget_package(package)
        raise TritonError.invalid_arg(f"failed to load model '{model}': {path} has no class TritonPythonModel")
    return module


def python_error_text(e: BaseException, paths: PublicPaths = ()) -> str:
    """``"<Type>: <message>\n\nAt:\n  <file>(<line>): <function>\n"``, innermost frame first, frames of
    this server left out: the text Triton's python backend produces for an exception in model code; the
    server's own folders in it (``paths``: a load request's, an object-store repository's copy) named as
    the client knows them."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(_OWN_DIR)]
    lines = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    text = f"{type(e).__name__}: {e}"
    return public_text(f"{text}\n\nAt:\n{lines}" if lines else text, paths)

"""What loads here but fails elsewhere, found without running the model: warnings for ``check``.

* ``KIND_GPU`` on a host without a GPU: the server refuses such a group here (as Triton does), so the
  model is checked with its groups on the CPU instead (``cpu_only``) and the check warns;
* ``EXECUTION_ENV_PATH`` (Triton's python backend unpacks that archive and runs the model with its
  interpreter): an archive that is missing or cannot be read, or whose Python is not this interpreter's;
* a Python model that imports a module this environment lacks: ``model.py`` is parsed (never run) and
  each absolute import is looked up with ``importlib.util.find_spec`` and among the files beside it.
  Imports guarded by ``except ImportError`` are optional and left alone.

Runs in the checker's process, which runs the same interpreter as the children that load the models.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tarfile
from pathlib import Path

from ..protocol._generated import model_config_pb2 as mc
from ..repository.config import ModelConfig

ENV_PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"
_PYTHON_IN_ENV = re.compile(r"(?:^|/)(?:lib/python|bin/python)(\d+\.\d+)(?:/|$)")
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def gpu_groups(cfg: ModelConfig) -> list[str]:
    """The instance groups that ask for a GPU."""
    return [g.name or f"{cfg.name}_{i}" for i, g in enumerate(cfg.instance_group) if g.kind == mc.ModelInstanceGroup.KIND_GPU]


def cpu_only(cfg: ModelConfig) -> ModelConfig:
    """A copy of ``cfg`` with every KIND_GPU group on the CPU (and no GPU ids)."""
    out = ModelConfig()
    out.CopyFrom(cfg)
    for group in out.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]
    return out


def warnings(cfg: ModelConfig, model_dir: Path, gpu_count: int) -> list[str]:
    """Every warning for one model whose config parsed."""
    found = []
    if gpu_count == 0 and gpu_groups(cfg):
        found.append(f"instance group(s) {', '.join(gpu_groups(cfg))} are KIND_GPU and this host has no GPU: "
                     "checked on the CPU here; the model loads only on a host with a GPU")
    env = cfg.parameters[ENV_PARAMETER].string_value if ENV_PARAMETER in cfg.parameters else ""
    if env:
        found += _environment(env.replace(_MODEL_DIR_VAR, str(model_dir)))
    if cfg.backend == "python":
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            found += missing_imports(version_dir / (cfg.default_model_filename or "model.py"), model_dir)
    return found


def _environment(path_text: str) -> list[str]:
    """An EXECUTION_ENV_PATH archive (or unpacked folder) that Triton could not use."""
    path = Path(path_text)
    if path.is_dir():
        names = [str(p.relative_to(path)) for p in (path / "lib").glob("python*")] if (path / "lib").is_dir() else []
    else:
        try:
            with tarfile.open(path) as archive:  # reads every header: a truncated archive fails here
                names = archive.getnames()
        except (OSError, tarfile.TarError, EOFError) as e:
            return [f"{ENV_PARAMETER} {path}: the archive cannot be unpacked ({e})"]
    versions = sorted({m.group(1) for m in map(_PYTHON_IN_ENV.search, names) if m})
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not versions:
        return [f"{ENV_PARAMETER} {path}: no Python interpreter found in it (lib/python3.X)"]
    if here not in versions:
        return [f"{ENV_PARAMETER} {path}: its interpreter is Python {', '.join(versions)}, this environment's "
                f"is {here}; the python backend's stub must run the archive's version"]
    return []


def missing_imports(model_file: Path, model_dir: Path) -> list[str]:
    """``model.py:LINE imports 'x'`` for each module neither this environment nor the model's folders
    provide. A file that does not parse is left to the load, which reports it."""
    try:
        tree = ast.parse(model_file.read_text(encoding="utf-8"), str(model_file))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found, seen = [], set()
    for node, top in _imports(tree):
        if top in seen or _available(top, (model_file.parent, model_dir)):
            continue
        seen.add(top)
        found.append(f"{model_file.relative_to(model_dir.parent)}:{node.lineno} imports '{top}', which this "
                     "environment lacks (importlib.util.find_spec found nothing)")
    return found


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    """(statement, top-level module) for every absolute import not guarded by ``except ImportError``."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h.type) for h in node.handlers):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            out += [(node, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node, node.module.split(".")[0]))
    return sorted(out, key=lambda item: item[0].lineno)


def _catches_import_error(kind: ast.expr | None) -> bool:
    if kind is None:
        return True
    names = kind.elts if isinstance(kind, ast.Tuple) else [kind]
    return any(isinstance(n, ast.Name) and n.id in _OPTIONAL for n in names)


def _available(module: str, folders: tuple[Path, ...]) -> bool:
    if module in sys.stdlib_module_names or module == "triton_python_backend_utils":
        return True
    if any((f / f"{module}.py").is_file() or (f / module).is_dir() for f in folders):
        return True  # the python backend puts the model's version and model folders on sys.path
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False

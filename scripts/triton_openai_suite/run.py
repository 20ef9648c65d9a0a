#!/usr/bin/env python3
"""Run Triton's own OpenAI-frontend test suite, unchanged, against triton_actor (docs/openai.md).

Triton's tests (``python/openai/tests`` of triton-inference-server/server) take their server from fixtures
in their ``conftest.py`` and helpers in ``utils.py``. This copies the test files as they are into a work
folder beside a shim ``conftest.py``/``utils.py`` (this folder's) that start ``python -m triton_actor`` with
``tiny_lm`` (and the MiniLM pipeline for the embeddings tests, Triton's ``mock_llm`` where a test names its
``test_models``), and stand-ins for the modules the test files import that are not ours
(``tritonserver``, the in-process server; ``fastapi.testclient`` where FastAPI is not installed; the
``RestrictedFeatures`` class of Triton's frontend, whose own tests then fail).

    git clone --depth 1 --filter=blob:none --sparse https://github.com/triton-inference-server/server
    git -C server sparse-checkout set python/openai/tests
    .venv/bin/python scripts/triton_openai_suite/run.py --tests server/python/openai/tests [pytest args]

By default the files that apply to a model of the contract run (``DEFAULT_FILES``); the others need
vLLM, TensorRT-LLM, the Hugging Face hub, or Triton's frontend's own modules (listed in docs/openai.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHIM = Path(__file__).resolve().parent
ROOT = SHIM.parents[1]
DEFAULT_FILES = ("test_completions.py", "test_chat_completions.py", "test_openai_client.py", "test_embeddings.py",
                 "test_observability.py", "test_openai_restricted_apis.py")


def prepare(tests: Path, work: Path) -> Path:
    """``work/tests``: Triton's files, then the shim's conftest, utils and repositories over theirs."""
    target = work / "tests"
    shutil.copytree(tests, target, dirs_exist_ok=True)
    for name in ("conftest.py", "utils.py", "repositories.py"):
        shutil.copyfile(SHIM / name, target / name)
    stubs = work / "stubs"
    stubs.mkdir(exist_ok=True)
    for module, path in (("tritonserver", "tritonserver.py"), ("fastapi", "fastapi"), ("frontend", "frontend")):
        if importlib.util.find_spec(module) is None:
            source = SHIM / "stubs" / path
            if source.is_dir():
                shutil.copytree(source, stubs / path, dirs_exist_ok=True)
            else:
                shutil.copyfile(source, stubs / path)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, required=True, help="python/openai/tests of Triton's server repository")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest (default: DEFAULT_FILES)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="triton_openai_suite_"))
    work.mkdir(parents=True, exist_ok=True)
    target = prepare(args.tests.resolve(), work)
    chosen = [a for a in args.pytest_args if a != "--"] or [str(target / f) for f in DEFAULT_FILES]
    env = dict(os.environ, TRITON_ACTOR_ROOT=str(ROOT), TRITON_OPENAI_SHIM_WORK=str(work),
               PYTHONPATH=os.pathsep.join([str(work), str(work / "stubs"), str(ROOT)]))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(work),
               "-q", "-rfEsx", *chosen]
    return subprocess.call(command, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())

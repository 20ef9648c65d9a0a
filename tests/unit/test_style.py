"""House rule: ruff clean. Runs in the test suite so CI enforces it with the README's one command."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    proc = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""The python backend imports ``model.py`` from source on every load (``backends/python/backend.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from triton_actor.backends.python.backend import import_model


def test_a_same_size_rewrite_within_the_same_second_is_not_served_stale(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the __pycache__ check is what would go wrong
    (tmp_path / "1").mkdir()
    source = tmp_path / "1" / "model.py"
    for edition in (1, 2):
        source.write_text(f"EDITION = {edition}\nclass TritonPythonModel:\n    pass\n")
        os.utime(source, (1_000_000, 1_000_000))  # same mtime, same size: a stale .pyc would pass its check
        assert import_model("m", tmp_path / "1", "model.py", f"e{edition}").EDITION == edition

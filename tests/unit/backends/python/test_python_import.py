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


def _model(repo: Path, name: str, helper_value: int) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text("import helper_mod\nVALUE = helper_mod.VALUE\nclass TritonPythonModel:\n    pass\n")
    (version / "helper_mod.py").write_text(f"VALUE = {helper_value}\n")
    return version


def test_each_model_gets_its_own_helpers_and_unloading_gives_everything_back(tmp_path: Path) -> None:
    from triton_actor.backends.python.backend import forget_package

    path_before, modules_before = list(sys.path), set(sys.modules)
    a, b = _model(tmp_path, "a", 1), _model(tmp_path, "b", 2)
    ma = import_model("a", a, "model.py", "t")
    mb = import_model("b", b, "model.py", "t")
    assert (ma.VALUE, mb.VALUE) == (1, 2)  # same module name, each model's own file
    (a / "helper_mod.py").write_text("VALUE = 11\n")
    ma2 = import_model("a", a, "model.py", "t")  # a reload sees the changed helper
    assert ma2.VALUE == 11
    for module in (ma, mb, ma2):
        forget_package(module.__name__.rpartition(".")[0])
    assert sys.path == path_before
    leftovers = {n for n in set(sys.modules) - modules_before if not n.endswith("triton_actor_models")}
    assert leftovers == set(), leftovers

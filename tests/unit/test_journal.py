"""The workers' journal (``triton_actor/workers/journal.py``): what a worker that starts later replays."""

from __future__ import annotations

from pathlib import Path

from triton_actor.workers.journal import Journal, change_key


def _down(name: str, version: int, reason: str) -> dict:
    return {"name": name, "version": version, "reason": reason, "files": "", "origin": "w1"}


def test_a_lost_version_is_journaled_after_its_load_until_the_model_is_loaded_or_unloaded(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.record("model.load", {"name": "m", "config": None, "files": {}})
    journal.record("model.down", _down("m", 1, "first"))
    journal.record("model.down", _down("m", 2, "other version"))
    journal.record("model.down", _down("m", 1, "reported last"))  # one entry per version: the last report
    journal.record("model.down", _down("n", 1, "another model"))
    assert [(key, kind, args.get("reason")) for key, kind, args in journal.read()] == [
        ("model:m", "model.load", None), ("down:m:2", "model.down", "other version"),
        ("down:m:1", "model.down", "reported last"), ("down:n:1", "model.down", "another model")]
    journal.record("model.load", {"name": "m", "config": None, "files": {}})  # back in every worker
    assert [key for key, _, _ in journal.read()] == ["down:n:1", "model:m"]
    journal.record("model.unload", {"name": "n", "unload_dependents": False})
    assert [key for key, _, _ in journal.read()] == ["model:m", "model:n"]
    assert change_key("model.down", _down("m", 3, "x")) == "down:m:3"

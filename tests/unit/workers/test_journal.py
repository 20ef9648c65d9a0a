"""The workers' journal (``triton_actor/workers/journal.py``): what a worker that starts later replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_actor.errors import Code, TritonError
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


def test_an_unload_of_a_model_nobody_knows_records_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for i in range(50):  # Triton answers each with success; none is desired state
        journal.record("model.unload", {"name": f"{i}".ljust(1024 * 1024, "x"), "unload_dependents": False},
                       known=False)
    assert not journal.path.exists()
    journal.record("model.unload", {"name": "m", "unload_dependents": False}, known=True)  # loaded at start
    journal.record("model.load", {"name": "n", "config": None, "files": {}})
    journal.record("model.unload", {"name": "n", "unload_dependents": False}, known=False)  # journaled: kept
    assert [(key, kind) for key, kind, _ in journal.read()] == [("model:m", "model.unload"),
                                                                ("model:n", "model.unload")]


def test_entries_stay_one_per_model_region_and_setting(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for i in range(20):
        journal.record("model.load", {"name": "m", "config": f'{{"max_batch_size": {i}}}', "files": {}})
        journal.record("shm.register", {"kind": "system", "name": f"r{i % 3}", "key": "/k", "offset": 0,
                                        "byte_size": 8})
        journal.record("runtime.log", {"changes": {"log_verbose_level": i}})
        journal.record("runtime.trace", {"changes": {"trace_rate": [str(i)]}, "model": "m"})
    entries = {key: args for key, _, args in journal.read()}
    assert sorted(entries) == ["log", "model:m", "shm:system:r0", "shm:system:r1", "shm:system:r2", "trace:m"]
    assert entries["model:m"]["config"] == '{"max_batch_size": 19}'  # the latest override replaced the others
    size = journal.path.stat().st_size
    journal.record("shm.unregister", {"kind": "system", "name": "r1"})
    journal.record("shm.unregister", {"kind": "system", "name": "never-registered"})
    assert "shm:system:r1" not in {key for key, _, _ in journal.read()}
    journal.record("shm.unregister", {"kind": "system", "name": ""})
    assert not any(key.startswith("shm:") for key, _, _ in journal.read())
    assert journal.path.stat().st_size < size


def test_a_change_that_would_pass_the_size_bound_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=64 * 1024)
    journal.record("model.load", {"name": "small", "config": "{}", "files": {}})
    kept = journal.path.read_bytes()
    big = {"name": "big", "config": "{}", "files": {"file:1/model.onnx": b"\0" * 64 * 1024}}
    with pytest.raises(TritonError) as e:
        journal.prepare("model.load", big)
    assert e.value.code == Code.INVALID_ARG and "journal" in e.value.message and "65536" in e.value.message
    assert journal.path.read_bytes() == kept
    journal.record("model.load", dict(big, files={"file:1/model.onnx": b"\0" * 1024}))  # smaller: fits
    assert [key for key, _, _ in journal.read()] == ["model:small", "model:big"]

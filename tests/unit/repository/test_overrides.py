"""Load-API overrides (``repository/overrides.py``), the HTTP body decoding (``protocol/repository_http.py``)
and change stamps (``repository/snapshot.py``)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.protocol import repository_http
from triton_actor.repository import overrides, snapshot


@pytest.mark.parametrize("key", ["file:", "file:../x", "file:1/../../x", "file:/etc/passwd", "file:1//x",
                                 "file:./1/x", "file:1\\..\\x", "file:1/x\x00y", "file:1/.."])
def test_paths_that_could_leave_the_directory_are_refused(key: str) -> None:
    with pytest.raises(TritonError) as e:
        overrides.check_path("m", key)
    assert e.value.code == Code.INVALID_ARG and "invalid file override" in e.value.message


def test_materialize_writes_only_inside_a_fresh_temp_dir() -> None:
    root = overrides.materialize("m", {"file:1/model.py": b"code", "file:labels.txt": b"a\nb"})
    try:
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["1", "1/model.py", "labels.txt"]
        assert (root / "1" / "model.py").read_bytes() == b"code"
        assert root.name.startswith("triton_actor_m_")
    finally:
        shutil.rmtree(root)


def test_materialize_cleans_up_after_a_clash() -> None:
    before = set(os.listdir(os.path.dirname(overrides.materialize("probe", {}))))
    with pytest.raises(TritonError, match="cannot write file override"):
        overrides.materialize("m", {"file:1": b"a file", "file:1/model.py": b"under it"})
    after = set(os.listdir(os.path.dirname(overrides.materialize("probe", {}))))
    assert not any(n.startswith("triton_actor_m_") for n in after - before)


def test_config_override_must_be_modelconfig_json() -> None:
    assert overrides.parse_config("m", json.dumps({"max_batch_size": 4})).max_batch_size == 4
    for bad in ("", "[]", '{"inputs": []}', '{"max_batch_size": "x"}'):
        with pytest.raises(TritonError) as e:
            overrides.parse_config("m", bad)
        assert e.value.code == Code.INVALID_ARG


def test_http_load_and_unload_bodies() -> None:
    body = json.dumps({"parameters": {"config": "{}", "file:1/a": base64.b64encode(b"\x00\x01").decode()}})
    assert repository_http.decode_load(body.encode()) == {"config": "{}", "file:1/a": b"\x00\x01"}
    assert repository_http.decode_load(b"") == {}
    assert repository_http.decode_unload(b'{"parameters":{"unload_dependents":true}}') is True
    with pytest.raises(TritonError) as e:
        repository_http.decode_load(b'{"parameters":')
    assert e.value.code == Code.INTERNAL  # Triton answers 500 here
    for bad, code in ((b'{"parameters": []}', Code.INTERNAL), (b'{"parameters": {"config": 1}}', Code.INTERNAL),
                      (b'{"parameters": {"file:1/a": "%%"}}', Code.INVALID_ARG)):
        with pytest.raises(TritonError) as e:
            repository_http.decode_load(bad)
        assert e.value.code == code
    assert repository_http.decode_unload(b'{"parameters":{"unload_dependents":"yes"}}') is False  # as Triton


def test_stamps_see_added_removed_resized_and_touched_files(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("a")
    first = snapshot.take(tmp_path)
    assert snapshot.take(tmp_path) == first
    assert first.part("1") == first.files and first.part("2") == ()
    os.utime(tmp_path / "1" / "model.py", ns=(1, 1))
    touched = snapshot.take(tmp_path)
    assert touched != first
    (tmp_path / "config.pbtxt").write_text("")
    assert snapshot.take(tmp_path).shared({"1"}) == (("config.pbtxt", 0, snapshot.take(tmp_path).files[1][2]),)


def test_stamps_survive_a_symlink_cycle(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("a")
    (tmp_path / "1" / "loop").symlink_to(tmp_path)
    files = [f[0] for f in snapshot.take(tmp_path).files]
    assert files == ["1/model.py"]

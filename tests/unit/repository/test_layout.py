"""Model repository layout rules (``triton_actor/repository/layout.py``; Triton's model_repository.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_actor.repository.layout import (
    contained,
    is_valid_model_name,
    list_models,
    list_versions,
    parse_version,
    read_labels,
    select_versions,
)


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("0", 0),
        ("1", 1),
        ("42", 42),
        ("3abc", 3),  # std::stoll stops at the first non-digit
        ("01", None),  # leading zero, longer than one character: ignored
        ("007", None),
        ("00", None),
        ("abc", None),
        ("", None),
        ("warmup", None),
        ("initial_state", None),
        ("configs", None),
    ],
)
def test_parse_version(name: str, version: int | None) -> None:
    assert parse_version(name) == version


def test_list_versions_applies_the_folder_rules(tmp_path: Path) -> None:
    model = tmp_path / "m"
    for d in ("0", "01", "3abc", "7", "warmup", "initial_state", "configs", "notes", "010"):
        (model / d).mkdir(parents=True)
    (model / "5").write_text("a file named like a version is not a version")
    (model / "config.pbtxt").write_text("")
    versions = list_versions(model)
    assert versions == {0: model / "0", 3: model / "3abc", 7: model / "7"}


def test_list_versions_of_missing_folder_is_empty(tmp_path: Path) -> None:
    assert list_versions(tmp_path / "nope") == {}


@pytest.mark.parametrize(
    ("kind", "arg", "available", "expected"),
    [
        ("latest", 1, [1, 2, 3], [3]),
        ("latest", 2, [3, 1, 2], [2, 3]),
        ("latest", 5, [1, 2], [1, 2]),
        ("latest", 0, [1, 2], []),
        ("latest", 1, [], []),
        ("latest", 1, [0], [0]),
        ("all", 0, [3, 1, 2], [1, 2, 3]),
        ("all", 0, [], []),
        ("specific", [1, 3], [1, 2, 3], [1, 3]),
        ("specific", [4, 1], [1, 2, 3], [1]),  # missing specific versions are skipped
        ("specific", [9], [1, 2], []),
        ("specific", [0], [0, 1], [0]),
    ],
)
def test_select_versions(kind: str, arg: object, available: list[int], expected: list[int]) -> None:
    assert select_versions(kind, arg, available) == expected  # type: ignore[arg-type]


def test_select_specific_logs_missing_versions(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="triton_actor.repository.layout"):
        assert select_versions("specific", [2, 5], [1, 2]) == [2]
    assert "version 5" in caplog.text


def test_list_models_across_repositories(tmp_path: Path) -> None:
    repo1, repo2 = tmp_path / "r1", tmp_path / "r2"
    for p in (repo1 / "a", repo1 / "b", repo1 / ".git", repo1 / ".hidden_model", repo2 / "a", repo2 / "c"):
        p.mkdir(parents=True)
    (repo1 / "README.md").write_text("files are not models")
    (repo2 / "d").write_text("")
    found = list_models([repo1, repo2])
    assert found == {"a": [repo1 / "a", repo2 / "a"], "b": [repo1 / "b"], "c": [repo2 / "c"]}
    # a name held by two repositories is visible as a duplicate
    assert [name for name, dirs in found.items() if len(dirs) > 1] == ["a"]


def test_list_models_skips_unreadable_repository(tmp_path: Path) -> None:
    (tmp_path / "ok" / "m").mkdir(parents=True)
    assert list_models([tmp_path / "missing", tmp_path / "ok"]) == {"m": [tmp_path / "ok" / "m"]}


@pytest.mark.parametrize("name", ["add_sub", "identity.onnx", "model-1", "a b", "UPPER", "x"])
def test_valid_model_names(name: str) -> None:
    assert is_valid_model_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", ".hidden", "a\x00b", "/abs"])
def test_invalid_model_names(name: str) -> None:
    assert not is_valid_model_name(name)


def test_contained_accepts_paths_inside(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "labels.txt").write_text("a\n")
    assert contained(model, model / "labels.txt")
    assert contained(model, model / "sub" / "x.txt")
    assert contained(model, model / "sub" / ".." / "labels.txt")
    # a symlink that stays inside the model directory is fine
    os.symlink(model / "labels.txt", model / "sub" / "link.txt")
    assert contained(model, model / "sub" / "link.txt")


def test_contained_rejects_escapes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve")
    assert not contained(model, model / ".." / "secret.txt")
    assert not contained(model, secret)
    assert not contained(model, Path("/etc/passwd"))
    # symlinks are followed: a link inside the model that points outside is an escape
    os.symlink(secret, model / "labels.txt")
    assert not contained(model, model / "labels.txt")
    os.symlink(tmp_path, model / "up")
    assert not contained(model, model / "up" / "secret.txt")
    # the sibling "model2" shares a string prefix with "model" but is not inside it
    (tmp_path / "model2").mkdir()
    assert not contained(model, tmp_path / "model2" / "x")


def test_read_labels(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(b"cat\r\ndog\n\nbird")
    assert read_labels(path) == ["cat", "dog", "", "bird"]

"""RepositoryActor's load API guards (``triton_actor/actors/repository/actor.py``): names and modes, as the gRPC
front end reaches them too (no URL routing in front of it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from triton_actor.actors.model.messages import LoadSettings
from triton_actor.actors.repository.actor import RepositoryActor
from triton_actor.errors import Code, TritonError


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[tuple[RepositoryActor, Path]]:
    root = tmp_path / "repo"
    (root / "m" / "1").mkdir(parents=True)
    actor = RepositoryActor([root], {}, LoadSettings(), control_mode="explicit")
    actor.start()
    yield actor, tmp_path
    actor.stop(timeout=5)


@pytest.mark.parametrize("name", ["..", ".", "/etc", "a/b", "../repo/m", "m/../m", ".hidden", "", "nope"])
def test_names_that_are_not_models_in_the_repository(repo, name: str) -> None:
    actor, tmp_path = repo
    with pytest.raises(TritonError) as e:
        actor.ref.load(name).get(5)
    assert e.value.code == Code.INTERNAL
    assert e.value.message.startswith(f"failed to load '{name}', failed to poll from model repository")
    assert actor._models == {}  # no model actor was made for it
    actor.ref.unload(name).get(5)  # unloading what is not there is fine (Triton: 200)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_file_override_paths_are_checked_before_anything_is_written(repo) -> None:
    actor, tmp_path = repo
    with pytest.raises(TritonError, match=r"invalid file override 'file:\.\./\.\./x'"):
        actor.ref.load("m", "{}", {"file:1/model.py": b"ok", "file:../../x": b"escape"}).get(5)
    assert actor._models == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_other_modes_refuse(tmp_path: Path, mode: str) -> None:
    actor = RepositoryActor([tmp_path], {}, LoadSettings(), control_mode=mode, poll_secs=0)
    actor.start()
    try:
        for call in (actor.ref.load, actor.ref.unload):
            with pytest.raises(TritonError) as e:
                call("m").get(5)
            assert e.value.code == Code.UNAVAILABLE
            assert e.value.message == "explicit model load / unload is not allowed if polling is enabled"
    finally:
        actor.stop(timeout=5)


def test_explicit_load_refreshes_object_store_mirrors_first(tmp_path: Path) -> None:
    """With object-store repositories the load API re-syncs them first (repository/remote.py), off the
    mailbox; a sync that fails fails the load with Triton's poll-failure text and the reason."""
    calls: list[str] = []
    outcome: list[TritonError | None] = [TritonError.unavailable("failed to read model repository 's3://b': down")]

    def refresh() -> None:
        calls.append("sync")
        if outcome[0] is not None:
            raise outcome[0]

    actor = RepositoryActor([tmp_path], {}, LoadSettings(), control_mode="explicit", refresh=refresh)
    actor.start()
    try:
        with pytest.raises(TritonError) as e:
            actor.ref.load("m").get(5)
        assert e.value.code == Code.INTERNAL
        assert e.value.message == ("failed to load 'm', failed to poll from model repository: "
                                   "failed to read model repository 's3://b': down")
        outcome[0] = None
        with pytest.raises(TritonError, match="failed to load 'm', failed to poll from model repository"):
            actor.ref.load("m").get(5)  # synced, but no such model: the usual answer
        assert calls == ["sync", "sync"] and actor._models == {}
    finally:
        actor.stop(timeout=5)


@pytest.mark.parametrize("journals", [False, True])
def test_a_config_override_text_is_held_only_until_parsed(repo, journals: bool) -> None:
    """Issue 23: the load API's ``config`` text was referenced from the front end's parameters, the data
    plane's broadcast and the repository actor's message for the whole load (one more copy of a 3.9 MiB
    override until it served). Now the data plane pops it into a one-shot holder that the repository
    actor's parse empties; with ``--workers`` (a host that journals) the text stays text, as the journal
    and the other workers need it."""
    import json

    from triton_actor.host.base import LocalHost
    from triton_actor.plane.dataplane import DataPlane
    from triton_actor.repository.overrides import ConfigText

    actor, _tmp_path = repo
    host = LocalHost()
    host.journals = journals  # type: ignore[misc]
    passed: list[object] = []

    def load(a: dict) -> None:
        passed.append(a["config"])
        return actor.ref.load(a["name"], a["config"], a["files"]).get(5)

    host.register("model.load", load)
    plane = DataPlane(actor, host=host)  # type: ignore[arg-type]
    text = json.dumps({"backend": "no_such_backend", "parameters": {"filler": {"string_value": "x" * 100_000}}})
    parameters: dict = {"config": text}
    with pytest.raises(TritonError, match="no_such_backend"):  # parsed, then refused: the backend is unknown
        plane.load_model("m", parameters)
    assert parameters == {}  # popped: the front end's decoded parameters hold no copy while it loads
    if journals:
        assert passed == [text]
        return
    (holder,) = passed
    assert isinstance(holder, ConfigText) and len(holder) == len(text)
    with pytest.raises(TritonError, match="parsed twice"):  # the parse took the text: nothing else holds it
        holder.take()

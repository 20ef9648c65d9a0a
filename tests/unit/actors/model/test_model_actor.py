"""ModelActor reloads (``triton_actor/actors/model/actor.py``) with a fake backend: load-then-swap ordering,
in-flight requests finishing on the old version, broken updates, version-policy changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import gevent.event
import numpy as np
import pytest

from tests.unit.actors.fakes import CONFIG, FakeBackend, until
from triton_actor.actors.model.actor import ModelActor
from triton_actor.actors.model.handles import READY, ModelHandle
from triton_actor.actors.model.messages import LoadSettings
from triton_actor.backends.base import InstanceContext
from triton_actor.errors import TritonError
from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository import config as config_mod
from triton_actor.runtime.kernel import Reply


def _edition_tag(ctx: InstanceContext, serial: int) -> float:
    """An instance's answer: 100 x its version + the edition written in its version folder."""
    return 100.0 * ctx.version + float((ctx.version_dir / "edition").read_text())


@pytest.fixture
def model(tmp_path: Path) -> Iterator[tuple[ModelActor, FakeBackend, list[ModelHandle]]]:
    backend = FakeBackend(_edition_tag)
    published: list[ModelHandle] = []

    def publish(handle: ModelHandle) -> Reply[None]:
        published.append(handle)
        backend.events.append(("publish", handle.ready_versions))
        done: Reply[None] = Reply()
        done.set(None)
        return done

    actor = ModelActor("m", {"fake": backend}, LoadSettings(auto_complete=False), publish)  # type: ignore[dict-item]
    actor.start()
    (tmp_path / "config.pbtxt").write_text(CONFIG)
    yield actor, backend, published
    actor.stop(timeout=10)


def _version(model_dir: Path, v: int, edition: int, broken: bool = False) -> None:
    (model_dir / str(v)).mkdir(exist_ok=True)
    (model_dir / str(v) / "edition").write_text(str(edition))
    if broken:
        (model_dir / str(v) / "broken").write_text("")


def _infer(handle: ModelHandle) -> Reply[InferResponse]:
    x = np.zeros(1, np.float32)
    return handle.resolve(-1).infer(InferRequest("m", -1, "", {"X": InferInput("X", BY_WIRE["FP32"], (1,), x)}))


def _tag(reply: Reply[InferResponse]) -> float:
    return float(reply.get(5).outputs[0][1][0])


def _held_on_version_1(tmp_path: Path, model: tuple[ModelActor, FakeBackend, list[ModelHandle]]) -> Reply[InferResponse]:
    """Version 1 (edition 1) loaded, and a request held in it by the closed gate."""
    actor, backend, published = model
    _version(tmp_path, 1, 1)
    actor.ref.load(tmp_path).get(10)
    backend.gate.close()
    in_flight = _infer(published[-1])
    until(lambda: backend.gate.reached == 1, "the request to run on version 1")
    return in_flight

def test_new_version_swaps_in_after_loading_and_old_drains(tmp_path: Path, model) -> None:
    actor, backend, published = model
    in_flight = _held_on_version_1(tmp_path, model)
    _version(tmp_path, 2, 2)
    loading = actor.ref.load(tmp_path)  # answered after the swap, before the drain of version 1 (Triton's)
    loading.get(10)
    assert ("publish", (2,)) in backend.events  # swapped
    assert not in_flight.ready()  # version 1 still runs its request
    backend.gate.open()
    assert _tag(in_flight) == 101  # finished on the old version
    assert _tag(_infer(published[-1])) == 202
    until(lambda: published[-1].versions[1].reason == "unloaded", "version 1 drained and unloaded")
    swap = backend.events.index(("publish", (2,)))
    assert backend.events.index(("finalize", 101.0)) > swap  # unloaded only after traffic moved
    assert published[-1].versions[1].reason == "unloaded"


def test_the_next_reload_waits_for_the_last_ones_drain(tmp_path: Path, model) -> None:
    """A reload answers at the swap and its old version drains behind the mailbox; the next reload that
    changes something waits for that drain, so reloads behind a request that does not end never pile up
    old versions (each one a model's memory)."""
    actor, backend, published = model
    in_flight = _held_on_version_1(tmp_path, model)
    _version(tmp_path, 1, 2)
    actor.ref.load(tmp_path).get(10)  # answered at the swap: edition 1 drains
    created, drains = backend.created, actor._drains
    parked = gevent.event.Event()  # set when the actor waits for a drain that is still running
    real_wait = drains.wait
    drains.wait = lambda: (drains._running and parked.set(), real_wait())  # type: ignore[method-assign]
    _version(tmp_path, 1, 3)
    third = actor.ref.load(tmp_path)
    assert parked.wait(10), "the third load did not wait for edition 1's drain"
    assert not third.ready() and backend.created == created  # nothing loaded while edition 1 drains
    backend.gate.open()
    third.get(10)
    assert _tag(in_flight) == 101 and _tag(_infer(published[-1])) == 103
    assert backend.created == created + 1


def test_broken_update_keeps_serving_and_says_why(tmp_path: Path, model) -> None:
    actor, _backend, published = model
    _version(tmp_path, 1, 1)
    actor.ref.load(tmp_path).get(10)
    _version(tmp_path, 2, 2, broken=True)
    with pytest.raises(TritonError, match=r"version 2 is at UNAVAILABLE state: .*broken on purpose"):
        actor.ref.load(tmp_path).get(10)
    handle = published[-1]
    assert handle.ready_versions == (1,) and 2 not in handle.versions
    assert "broken on purpose" in handle.versions[1].reason and handle.versions[1].state == READY
    assert _tag(_infer(handle)) == 101


def test_unchanged_load_is_a_no_op_and_policy_change_touches_only_named_versions(tmp_path: Path, model) -> None:
    actor, backend, published = model
    _version(tmp_path, 1, 1)
    _version(tmp_path, 2, 2)
    actor.ref.load(tmp_path).get(10)
    count = len(published)
    actor.ref.load(tmp_path).get(10)
    assert len(published) == count  # nothing changed: nothing published
    (tmp_path / "config.pbtxt").write_text(CONFIG + "version_policy: { all { } }\n")
    actor.ref.load(tmp_path).get(10)
    assert published[-1].ready_versions == (1, 2)
    assert not any(e[0] == "finalize" for e in backend.events)  # version 2 kept its instance
    (tmp_path / "config.pbtxt").write_text(CONFIG + "version_policy: { specific { versions: [1] } }\n")
    actor.ref.load(tmp_path).get(10)
    assert published[-1].ready_versions == (1,)
    until(lambda: any(e[0] == "finalize" for e in backend.events), "version 2 unloaded")  # after the answer
    assert [e for e in backend.events if e[0] == "finalize"] == [("finalize", 202.0)]


def test_unload_drains_then_reports_unloaded(tmp_path: Path, model) -> None:
    actor, backend, published = model
    _version(tmp_path, 1, 1)
    actor.ref.load(tmp_path).get(10)
    backend.gate.close()
    in_flight = _infer(published[-1])
    until(lambda: backend.gate.reached == 1, "the request to run")
    unloading = actor.ref.unload()
    until(lambda: published[-1].ready_versions == (), "version 1 to leave the routes")
    assert not in_flight.ready() and not unloading.ready()  # it drains
    backend.gate.open()
    unloading.get(10)
    assert _tag(in_flight) == 101
    assert published[-1].versions[1].state == "UNAVAILABLE" and published[-1].versions[1].reason == "unloaded"


def test_override_directories_live_as_long_as_they_serve(tmp_path: Path, model) -> None:
    actor, _backend, published = model
    dirs = []
    for edition in (1, 2):
        d = tmp_path / f"override{edition}"
        d.mkdir()
        (d / "config.pbtxt").write_text(CONFIG)
        _version(d, 1, edition)
        dirs.append(d)
        actor.ref.load(d, owned=True).get(10)
        assert _tag(_infer(published[-1])) == 100 + edition
    # the replaced one goes once its version drained, after the load answered (at the swap, as Triton's)
    until(lambda: not dirs[0].exists(), "the replaced override directory removed")
    assert dirs[1].exists()
    broken = tmp_path / "override3"
    broken.mkdir()
    (broken / "config.pbtxt").write_text(CONFIG)
    _version(broken, 1, 3, broken=True)
    with pytest.raises(TritonError):
        actor.ref.load(broken, owned=True).get(10)
    assert not broken.exists() and dirs[1].exists()  # a failed override is removed, the serving one kept
    actor.ref.unload().get(10)
    assert not dirs[1].exists()


def test_a_config_override_is_held_once_while_it_serves(tmp_path: Path, model) -> None:
    """A load's config override (the repository actor's parse of the load request's ``config``) is the
    load's own: the model actor completes it in place and serves with it. Before, it completed a copy,
    so an override of one big field was held twice over while loaded (and once more while it loaded:
    issue 23, a 3.9 MiB override peaked at 7x its size); the instances' JSON is made from it."""
    actor, backend, published = model
    contexts: list[InstanceContext] = []
    create = backend.create
    backend.create = lambda ctx: (contexts.append(ctx), create(ctx))[1]  # type: ignore[method-assign]
    _version(tmp_path, 1, 1)
    override = config_mod.parse_text(CONFIG + 'parameters { key: "filler" value { string_value: "xyz" } }', "m",
                                      "override")
    actor.ref.load(tmp_path, config=override).get(10)
    assert published[-1].config is override and override.instance_group[0].name == "m"  # completed in place
    assert json.loads(contexts[-1].config_json) == config_mod.to_json_dict(override)
    assert json.loads(contexts[-1].config_json)["parameters"]["filler"]["string_value"] == "xyz"


def test_version_down_from_a_replaced_scheduler_is_ignored(tmp_path: Path, model) -> None:
    """VersionDown (a scheduler: no instance left) turns the version that scheduler serves UNAVAILABLE;
    the same event from the scheduler of a version replaced since is stale and changes nothing."""
    from triton_actor.actors.model.handles import UNAVAILABLE
    from triton_actor.actors.model.messages import VersionDown

    actor, _backend, published = model
    _version(tmp_path, 1, 1)
    actor.ref.load(tmp_path).get(10)
    old = published[-1].versions[1].scheduler
    _version(tmp_path, 1, 3)  # the same version, new files: a new record with a new scheduler
    actor.ref.load(tmp_path).get(10)
    current = published[-1].versions[1].scheduler
    assert current is not old and _tag(_infer(published[-1])) == 103
    count = len(published)
    actor.ref.tell(VersionDown(1, old, "stale"))
    actor.ref.tell(VersionDown(1, current, "every instance is down"))  # handled after the stale one
    until(lambda: published[-1].versions[1].state == UNAVAILABLE, "version 1 to be UNAVAILABLE")
    assert [h.versions[1].reason for h in published[count:]] == ["no instance left: every instance is down"]
    assert published[-1].ready_versions == ()


def test_mark_down_from_another_worker_takes_down_the_same_load_only(tmp_path: Path, model) -> None:
    """MarkDown (the host: a version lost its instances in another worker) turns the same load UNAVAILABLE
    with that reason; files that differ (POLL: this worker loaded a change since) leave it serving. In the
    worker that lost it (``here``) it only checks that nothing loaded the version again: its reply fails
    then, which stops the host's broadcast."""
    from triton_actor.actors.model.handles import UNAVAILABLE
    from triton_actor.repository import snapshot

    actor, backend, published = model
    (tmp_path / "config.pbtxt").write_text(CONFIG + "version_policy: { all { } }\n")
    _version(tmp_path, 1, 1)
    _version(tmp_path, 2, 2)
    actor.ref.load(tmp_path).get(10)
    files = snapshot.take(tmp_path).digest()

    def mark(version: int, reason: str, files: str, here: bool = False) -> bool:
        done: Reply[bool] = Reply()
        actor.ref.mark_down(version, reason, files, here, done)
        return done.get(10)

    assert not mark(1, "no instance left: elsewhere", "other files")
    assert published[-1].ready_versions == (1, 2)
    assert mark(1, "no instance left: elsewhere", files)
    assert published[-1].ready_versions == (2,)  # the other version serves on
    assert published[-1].versions[1].state == UNAVAILABLE
    assert published[-1].versions[1].reason == "no instance left: elsewhere"
    assert mark(1, "no instance left: reported last", "")  # two reports: the last one's reason
    drained: Reply[None] = Reply()
    actor.ref.settled(drained)  # its instances drain behind the mailbox
    drained.get(10)
    assert ("finalize", 101.0) in backend.events  # its instances were unloaded here too
    assert published[-1].versions[1].reason == "no instance left: reported last"
    assert not mark(1, "no instance left: reported last", files, here=True)  # still down: the broadcast goes on
    with pytest.raises(TritonError, match="changed since it lost its instances"):
        mark(1, "no instance left: my own", files, here=True)  # another report came first
    actor.ref.load(tmp_path).get(10)  # a load brings it back
    assert published[-1].ready_versions == (1, 2)
    with pytest.raises(TritonError, match="changed since it lost its instances"):
        mark(1, "no instance left: reported last", files, here=True)


def test_a_version_that_lost_its_instances_is_announced(tmp_path: Path) -> None:
    """VersionDown: UNAVAILABLE here first, then announced (model, version, reason, files digest) for the
    host to tell the other workers."""
    from triton_actor.actors.model.messages import VersionDown
    from triton_actor.repository import snapshot

    published: list[ModelHandle] = []
    announced: list[tuple[str, int, str, str]] = []

    def publish(handle: ModelHandle) -> Reply[None]:
        published.append(handle)
        done: Reply[None] = Reply()
        done.set(None)
        return done

    actor = ModelActor("m", {"fake": FakeBackend()}, LoadSettings(auto_complete=False), publish,  # type: ignore[dict-item]
                       announce=lambda *a: announced.append((*a,)))
    actor.start()
    try:
        (tmp_path / "config.pbtxt").write_text(CONFIG)
        _version(tmp_path, 1, 1)
        actor.ref.load(tmp_path).get(10)
        actor.ref.tell(VersionDown(1, published[-1].versions[1].scheduler, "gone"))
        until(lambda: bool(announced), "the announcement")
        assert announced == [("m", 1, "no instance left: gone", snapshot.take(tmp_path).digest())]
        assert published[-1].ready_versions == ()
    finally:
        actor.stop(timeout=10)

"""start_version (actors/model/version.py): a load that fails part-way leaves nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_actor.actors.model import version as version_module
from triton_actor.actors.model.handles import UNAVAILABLE
from triton_actor.actors.model.version import VersionSource, start_version
from triton_actor.protocol._generated import model_config_pb2 as mc


def test_instances_started_before_one_that_cannot_start_are_closed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting the third of five instances fails (``can't start new thread``): the two started were
    kept with their threads, because the list was built in one expression that never finished, so
    the failure had nothing to close. 1000 instances under a memory limit kept 222 threads, and every
    later load failed the same way."""
    started: list[FakeInstance] = []

    class FakeInstance:
        def __init__(self, ctx: object, backend: object) -> None:
            if len(started) == 2:
                raise RuntimeError("can't start new thread")
            self.closed = False
            started.append(self)

        def close(self, timeout: float | None = None) -> None:
            self.closed = True

    monkeypatch.setattr(version_module, "ModelInstance", FakeInstance)
    config = mc.ModelConfig(name="m", backend="python")
    config.instance_group.add(count=5, kind=mc.ModelInstanceGroup.KIND_CPU, name="m")
    src = VersionSource("m", 1, tmp_path, tmp_path / "1", config, "{}", object(), {}, ())  # type: ignore[arg-type]
    rec = start_version(src, load_timeout_s=1)
    assert rec.state == UNAVAILABLE and "can't start new thread" in rec.reason
    assert len(started) == 2 and all(inst.closed for inst in started)

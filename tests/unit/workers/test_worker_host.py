"""WorkerHost.broadcast (workers/worker_host.py) with two hosts in one process: a change another worker
refuses is undone and raised with that worker's message, without its pid or the run folder's path (a
client saw "(worker 12345; ...)", and "worker at /tmp/.../workers/12345.sock did not answer")."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_actor.errors import Code, TritonError
from triton_actor.workers.worker_host import WorkerHost


@pytest.mark.timeout(30)
def test_a_change_another_worker_refuses_does_not_name_its_process(tmp_path: Path) -> None:
    this, other = WorkerHost(tmp_path, 1, pid=1111), WorkerHost(tmp_path, 2, pid=2222)
    applied: list[str] = []
    this.register("runtime.log", lambda args: applied.append(args["settings"]) or args["settings"])

    def refuse(args: dict) -> None:
        raise TritonError.invalid_arg("refused here")

    other.register("runtime.log", refuse)
    for host in (this, other):
        host.join()
        host.booted.set()
    try:
        with pytest.raises(TritonError) as refused:
            this.broadcast("runtime.log", {"settings": "new"})
        assert refused.value.code == Code.INVALID_ARG
        assert refused.value.message.startswith("refused here (on another worker;")
        assert "2222" not in refused.value.message and str(tmp_path) not in refused.value.message
    finally:
        for host in (this, other):
            host.leave()

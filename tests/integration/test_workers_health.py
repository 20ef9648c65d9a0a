"""A version that lost every instance in one worker process is unavailable in every worker (docs/health.md).

With gunicorn workers each worker owns its instances. Before the fix the version went unavailable only in
the worker whose instances died: a client saw the model ready on one connection and "unknown model ...
has no available versions" on the next, and strict readiness depended on the worker that answered. Now
the worker broadcasts it (hostwide.LostVersions, a journaled change): every worker says the same, a
worker that starts later agrees, and a load (EXPLICIT) or a change of the files (POLL) brings the
version back everywhere. A real gunicorn arbiter, the official tritonclient, waits on conditions.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import gevent.pool
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.actors.model.handles import READY, UNAVAILABLE
from triton_actor.actors.model.messages import VersionDown
from triton_actor.config.command_line import parse
from triton_actor.server import Server
from triton_actor.workers.journal import locked
from triton_actor.workers.worker_host import WorkerHost

from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn
from .model_control import index, wait_for
from .server import add_model
from .test_instance_health import CONFIG, KILLER_PY

pytestmark = pytest.mark.timeout(300)
REASON = "no instance left: instance 'one_0_0' stopped 4 times within 60 s"
GONE = "Request for unknown model: 'one' has no available versions"
DIED, BACK = "native worker one_0_0 stopped unexpectedly", "instance one_0_0 is serving again"  # log lines


def _infer(client: Any, model: str, value: float) -> float:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    x = module.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return float(client.infer(model, [x]).as_numpy("OUTPUT0")[0])


@dataclass
class Answer:
    """What one worker said over one connection (``pid``: the worker's, asked first and last)."""

    pid: int
    ready: bool
    server_ready: bool
    entry: dict
    result: str  # the echoed value, or the error's message


def _ask(url: str) -> Answer:
    client = httpclient.InferenceServerClient(url, concurrency=1)  # one connection: one worker answers it all
    try:
        pid = int(_infer(client, "pid", 0.0))
        try:
            result = str(_infer(client, "one", 5.0))
        except InferenceServerException as e:
            result = e.message()
        answer = Answer(pid, client.is_model_ready("one"), client.is_server_ready(), index(client)[("one", "1")],
                        result)
        assert int(_infer(client, "pid", 0.0)) == pid, "the connection moved to another worker"
        return answer
    finally:
        client.close()


def _by_worker(url: str, workers: set[int], tries: int = 400) -> dict[int, list[Answer]]:
    """Answers over fresh connections, eight at a time, until every worker in ``workers`` gave some."""
    seen: dict[int, list[Answer]] = {}
    for _ in range(0, tries, 8):
        for answer in gevent.pool.Pool(8).map(lambda _: _ask(url), range(8)):
            seen.setdefault(answer.pid, []).append(answer)
        if workers <= set(seen):
            break
    assert set(seen) == workers, f"answers came from {set(seen)}, workers are {workers}"
    return seen


def _all_down(url: str, workers: set[int]) -> bool:
    return all(not a.ready for answers in _by_worker(url, workers).values() for a in answers)


def _assert_down_everywhere(g: Gunicorn, workers: set[int]) -> None:
    wait_for(lambda: _all_down(g.url, workers), 60, f"'one' not ready in every worker:\n{g.log()}")
    answers = [a for per_worker in _by_worker(g.url, workers).values() for a in per_worker]
    for a in answers:
        assert not a.ready and not a.server_ready, a  # strict readiness: the same in every worker
        assert a.entry["state"] == "UNAVAILABLE" and a.entry["reason"].startswith(REASON), a
        assert a.result == GONE, a
    assert len({a.entry["reason"] for a in answers}) == 1, answers  # the same reason everywhere
    for _ in range(8):  # gRPC, fresh channels
        grpc = grpcclient.InferenceServerClient(g.grpc_url)
        try:
            assert not grpc.is_model_ready("one") and not grpc.is_server_ready()
            with pytest.raises(InferenceServerException) as e:
                _infer(grpc, "one", 1.0)
            assert e.value.message() == GONE, e.value.message()
        finally:
            grpc.close()


def _assert_ready_everywhere(g: Gunicorn, workers: set[int]) -> None:
    for answers in _by_worker(g.url, workers).values():
        for a in answers:
            assert a.ready and a.server_ready and a.entry["state"] == "READY" and a.result == "5.0", a


def _lines(g: Gunicorn, pid: int, text: str) -> int:
    return sum(1 for line in g.stderr.lines if f" {pid} " in line and text in line)


def _kill_until_down(g: Gunicorn, victims: list[tuple[httpclient.InferenceServerClient, int]]) -> None:
    """Kill the thread of the one instance of each worker ``pid`` (its ``client``'s connection goes there),
    all at once, each time it is back, until that version is down in every one of them: past the budget,
    or taken down by another worker's broadcast."""
    def down(pid: int) -> int:
        return _lines(g, pid, "past its restart budget") + _lines(g, pid, "(in another worker process)")

    before = {pid: down(pid) for _, pid in victims}
    for _ in range(20):  # bounded: 4 deaths are needed
        alive = [(c, pid) for c, pid in victims if down(pid) == before[pid]]
        if not alive:
            return
        deaths = {pid: _lines(g, pid, DIED) for _, pid in alive}
        back = {pid: _lines(g, pid, BACK) for _, pid in alive}
        answers = gevent.pool.Pool(len(alive)).map(lambda v: _infer(v[0], "one", -7), alive)
        assert answers == [0.0] * len(alive)  # each instance answers, then its thread dies

        def passed(counts: dict[int, int], text: str) -> bool:  # each one: that line once more, or down
            return all(_lines(g, p, text) > n or down(p) > before[p] for p, n in counts.items())

        assert g.stderr.wait(lambda d=deaths: passed(d, DIED), 60), f"one_0_0 of {list(deaths)} never died:\n{g.log()}"
        assert g.stderr.wait(lambda b=back: passed(b, BACK), 60), f"one_0_0 of {list(back)} never back:\n{g.log()}"
    raise AssertionError(f"one_0_0 never went past its restart budget in {victims}:\n{g.log()}")


def _pinned(url: str, avoid: set[int]) -> tuple[httpclient.InferenceServerClient, int]:
    """A client whose one connection reached a worker not in ``avoid``."""
    for _ in range(100):  # bounded: the kernel spreads new connections
        client = httpclient.InferenceServerClient(url, concurrency=1)
        pid = int(_infer(client, "pid", 0.0))
        if pid not in avoid:
            return client, pid
        client.close()
    raise AssertionError(f"no connection reached a worker other than {avoid}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path / "repo", "pid", PID_CONFIG, PID_PY)
    add_model(tmp_path / "repo", "one", CONFIG.format(count=1, extra=""), KILLER_PY.format(victim="one_0_0", hub=True))
    return tmp_path / "repo"


def test_explicit_a_version_down_in_one_worker_is_down_in_every_worker_until_loaded(repo: Path) -> None:
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode=explicit", "--load-model=*",
                 "--strict-readiness=true", workers=2)
    try:
        workers = set(g.wait_serving(2))
        _assert_ready_everywhere(g, workers)
        victim, pid = _pinned(g.url, set())
        _kill_until_down(g, [(victim, pid)])
        _assert_down_everywhere(g, workers)

        g.signal(signal.SIGTTIN)  # a worker that starts now agrees (the journal)
        workers.add(g.wait_serving(3)[2])
        _assert_down_everywhere(g, workers)

        victim.load_model("one")  # a load brings it back in every worker, with fresh instances
        _assert_ready_everywhere(g, workers)

        # two workers lose it at once: no deadlock on the control lock, one reason everywhere
        other, other_pid = _pinned(g.url, {pid})
        _kill_until_down(g, [(victim, pid), (other, other_pid)])
        _assert_down_everywhere(g, workers)
        other.load_model("one")
        _assert_ready_everywhere(g, workers)
        victim.close()
        other.close()
    finally:
        assert g.stop() == 0


def test_poll_a_version_down_in_one_worker_comes_back_everywhere_when_its_files_change(repo: Path) -> None:
    g = Gunicorn("--model-repository", str(repo), "--model-control-mode=poll", "--repository-poll-secs=1",
                 "--strict-readiness=true", workers=2)
    try:
        workers = set(g.wait_serving(2))
        victim, pid = _pinned(g.url, set())
        _kill_until_down(g, [(victim, pid)])
        _assert_down_everywhere(g, workers)
        (repo / "one" / "1" / "model.py").write_text(KILLER_PY.format(victim="none", hub=True))
        wait_for(lambda: all(a.ready for answers in _by_worker(g.url, workers).values() for a in answers), 60,
                 f"'one' ready again in every worker:\n{g.log()}")
        _assert_ready_everywhere(g, workers)
        victim.close()
    finally:
        assert g.stop() == 0


# -- two workers' hosts in this process: the races, made to happen --------------------------------------
FAKE_CONFIG = PID_CONFIG.replace('"python"', '"fake"')


class _Instance:
    inline_ok = False

    def execute(self, requests: list[Any]) -> list[Any]:
        raise AssertionError("not run")

    def finalize(self) -> None:
        pass


class _Backend:
    name = "fake"

    def auto_complete(self, *args: Any, **kw: Any) -> None:
        pass

    def create(self, ctx: Any) -> _Instance:
        return _Instance()


@pytest.fixture
def two_workers(tmp_path: Path) -> Any:
    """Two servers with a WorkerHost each on one run directory (pids made up: they name the sockets)."""
    add_model(tmp_path / "repo", "m", FAKE_CONFIG, "")
    (tmp_path / "run").mkdir()
    settings = parse(["--model-repository", str(tmp_path / "repo"), "--model-control-mode=explicit",
                      "--load-model=m"])
    servers = []
    for worker in (1, 2):
        host = WorkerHost(tmp_path / "run", worker, pid=10_000_000 + worker)
        server = Server(settings, backends={"fake": _Backend()}, host=host)  # type: ignore[dict-item]
        server.start_actors()
        host.join()
        server.load_models()
        host.mark_ready()
        servers.append(server)
    yield servers
    for server in servers:
        server.host.leave()  # type: ignore[attr-defined]
        server.stop()


def _version(server: Server) -> Any:
    return server.repository.routes["m"].versions[1]


def _lose(server: Server, reason: str) -> None:
    """What the version's scheduler tells its model actor when its last instance is DOWN."""
    server.repository._models["m"].ref.tell(VersionDown(1, _version(server).scheduler, reason))


def _journaled(server: Server) -> list[tuple[str, str, dict]]:
    return [c for c in server.host.journal.read() if c[0].startswith("down:")]  # type: ignore[attr-defined]


def test_two_workers_that_lose_a_version_at_once_agree(two_workers: list[Server], caplog: Any) -> None:
    """Both lose it before either broadcast ran: both broadcast, one after the other under the control
    lock (no deadlock), and every worker and the journal end with the same reason (the last one's)."""
    a, b = two_workers
    _lose(a, "lost in a")
    _lose(b, "lost in b")
    wait_for(lambda: len(_journaled(a)) == 1 and _version(a).reason == _version(b).reason
             and _version(a).reason == _journaled(a)[0][2]["reason"], 30, "one reason everywhere")
    assert _version(a).state == _version(b).state == UNAVAILABLE
    assert _version(a).reason in ("no instance left: lost in a", "no instance left: lost in b")
    here = [r.getMessage() for r in caplog.records if r.getMessage().endswith(("lost in a", "lost in b"))]
    assert len(here) == 2, here  # each lost it on its own first: the race happened
    for server in two_workers:
        assert not server.repository.routes["m"].ready_versions and not server.repository.all_ready()


def test_a_loss_broadcast_after_a_load_changes_nothing(two_workers: list[Server], caplog: Any) -> None:
    """The version went down in one worker, then a load brought it back before the broadcast had the
    control lock: the broadcast stops in that worker; the other keeps serving, nothing is journaled."""
    a, b = two_workers
    caplog.set_level(logging.INFO, logger="triton_actor.workers")
    with locked(a.host.run_dir, 30):  # type: ignore[attr-defined] - what a load on another worker holds
        _lose(a, "lost in a")
        wait_for(lambda: _version(a).state == UNAVAILABLE, 30, "down in a")
        a.repository.ref.load("m").get(30)  # (a load under the lock reaches a and b: b is READY already)
        assert _version(a).state == READY
    wait_for(lambda: "version 1 changed since it lost its instances" in caplog.text, 30, "the broadcast to stop")
    assert _version(b).state == READY and _journaled(a) == []

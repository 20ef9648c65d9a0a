"""Load on first request (``plane/on_demand.py``): one load per model at a time, only folders directly in
a repository, a bounded number of waiting requests, each bounded by its own timeout."""

from __future__ import annotations

from pathlib import Path

import gevent
import gevent.event
import pytest

from triton_actor.config.command_line import parse
from triton_actor.errors import Code, TritonError
from triton_actor.plane.on_demand import OnDemand


def test_one_load_per_model_and_only_folders_of_a_repository(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "file").write_text("")
    release = gevent.event.Event()
    loads: list[str] = []
    on_demand = OnDemand([tmp_path], lambda name: (loads.append(name), release.wait(10)))
    first = on_demand.start("m")
    assert first is not None and on_demand.start("m") is first
    for name in ("nope", "file", "..", ".", "m/..", "../m", "", "m\0"):
        assert on_demand.start(name) is None, name
    release.set()
    on_demand.wait("m", first, 0)
    assert loads == ["m"] and on_demand.started == 1
    assert on_demand.start("m") is not first  # over: the next request starts another


def test_waiting_is_bounded_in_number_and_by_the_requests_timeout(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    release = gevent.event.Event()
    on_demand = OnDemand([tmp_path], lambda name: release.wait(10), most_waiting=1)
    load = on_demand.start("m")
    assert load is not None
    waiter = gevent.spawn(on_demand.wait, "m", load, 0)
    gevent.sleep(0)  # the first request waits
    with pytest.raises(TritonError) as info:
        on_demand.wait("m", load, 0)
    assert info.value.code == Code.UNAVAILABLE and "already wait" in info.value.message
    release.set()
    waiter.get(timeout=10)
    slow = OnDemand([tmp_path], lambda name: gevent.sleep(10))  # a load slower than the wait's 1 ms timeout
    with pytest.raises(TritonError, match="timeout expired while model 'm' was loading"):
        slow.wait("m", slow.start("m"), 1000)  # type: ignore[arg-type]


def test_a_failed_load_is_each_waiting_requests_answer(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()

    def fail(name: str) -> None:
        raise TritonError.invalid_arg(f"failed to load '{name}': bad config")

    on_demand = OnDemand([tmp_path], fail)
    load = on_demand.start("m")
    for _ in range(2):
        with pytest.raises(TritonError, match="bad config"):
            on_demand.wait("m", load, 0)  # type: ignore[arg-type]


def test_the_flag_needs_explicit_or_poll_mode() -> None:
    for mode in ("explicit", "poll"):
        assert parse(["--model-repository", "r", f"--model-control-mode={mode}", "--model-load-on-demand"],
                     environ={}).model_load_on_demand
    with pytest.raises(SystemExit, match="--model-load-on-demand needs --model-control-mode=explicit or poll"):
        parse(["--model-repository", "r", "--model-load-on-demand"], environ={})

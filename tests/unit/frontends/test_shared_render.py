"""SharedRender (frontends/metrics_server.py): scrapes share renders, every answer is rendered after its
scrape arrived, renders are spaced by RENDER_GAP times their length, and a failure reaches every scrape
that shared the render while the next one starts afresh."""

from __future__ import annotations

import gevent
import pytest

from triton_actor.frontends.metrics_server import SharedRender


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_scrapes_arriving_during_a_render_share_the_next_one() -> None:
    clock, state = Clock(), {"value": 0}
    gate = gevent.event.Event()

    def render() -> bytes:
        seen = state["value"]
        clock.now += 0.001
        gate.wait(5)
        return b"%d" % seen

    shared = SharedRender(render, gap=0.0, clock=clock)
    first = gevent.spawn(shared)
    gevent.sleep(0)  # the first render runs (waits on the gate)
    state["value"] = 1  # what happened after the first render started
    later = [gevent.spawn(shared) for _ in range(10)]
    gevent.sleep(0)  # one hub turn: they run until they wait for the next render
    gate.set()
    gevent.joinall([first, *later], timeout=5, raise_error=True)
    assert first.value == b"0"
    assert {g.value for g in later} == {b"1"}, "a scrape got a render that started before it came"
    assert shared.renders == 2


def test_renders_are_spaced_by_the_gap() -> None:
    clock = Clock()
    sleeps: list[float] = []

    def render() -> bytes:
        clock.now += 0.002  # a render of 2 ms
        return b"x"

    shared = SharedRender(render, gap=4.0, clock=clock)
    original = gevent.sleep
    try:
        gevent.sleep = lambda s=0: (sleeps.append(s), setattr(clock, "now", clock.now + s))  # type: ignore[assignment]
        assert shared() == b"x" and sleeps == []
        assert shared() == b"x"
    finally:
        gevent.sleep = original
    assert sleeps == [pytest.approx(0.008)]


def test_a_failed_render_fails_the_scrapes_that_shared_it_and_the_next_starts_afresh() -> None:
    calls = {"n": 0}
    gate = gevent.event.Event()

    def render() -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            gate.wait(5)  # the render under way while the others arrive
        if calls["n"] == 2:
            raise ValueError("broken collector")
        return b"ok"

    shared = SharedRender(render, gap=0.0)
    first = gevent.spawn(shared)
    gevent.sleep(0)  # one hub turn: the first render runs (waits on the gate)
    joined = [gevent.spawn(shared) for _ in range(3)]  # they share the second render, which fails
    gevent.sleep(0)  # one hub turn: they run until they wait for it
    gate.set()
    gevent.joinall([first, *joined], timeout=5)
    assert first.value == b"ok"
    assert all(isinstance(g.exception, ValueError) for g in joined)
    assert shared() == b"ok" and shared.renders == 3


def test_the_pause_is_capped() -> None:
    """A render that waited 2 s (other workers' snapshots: the hub was free) does not hold the next for 8 s."""
    clock = Clock()
    sleeps: list[float] = []

    def render() -> bytes:
        clock.now += 2.0
        return b"x"

    shared = SharedRender(render, gap=4.0, clock=clock)
    original = gevent.sleep
    try:
        gevent.sleep = lambda s=0: (sleeps.append(s), setattr(clock, "now", clock.now + s))  # type: ignore[assignment]
        shared()
        shared()
    finally:
        gevent.sleep = original
    assert sleeps == [pytest.approx(0.25)]

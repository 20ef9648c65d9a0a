"""The one offload rule (``frontends/offload.py``): small conversions on the hub, big ones on a native
thread one at a time with the collector paused, for HTTP and gRPC alike."""

from __future__ import annotations

import gc
import threading

import gevent
import pytest

from triton_actor.errors import TritonError
from triton_actor.frontends import offload
from triton_actor.frontends.offload import WORK_ON_HUB, Offload, json_work
from triton_actor.runtime.bridge import call_in_thread
from triton_actor.runtime.threads import NativeEvent


def test_small_work_runs_on_the_hub_and_big_work_on_a_thread() -> None:
    where = []
    rule = Offload()
    rule.run(WORK_ON_HUB, lambda: where.append(threading.current_thread()))
    rule.run(WORK_ON_HUB + 1, lambda: where.append(threading.current_thread()))
    hub_thread = threading.current_thread()
    assert where[0] is hub_thread and where[1] is not hub_thread


def test_a_mebibyte_of_json_is_the_hub_bound() -> None:
    """HTTP's JSON text and gRPC's typed elements share one bound: 1 MiB of JSON is WORK_ON_HUB elements."""
    assert json_work(1 << 20) == WORK_ON_HUB and json_work((1 << 20) + 4) > WORK_ON_HUB


def test_big_conversions_run_one_at_a_time() -> None:
    """The second big conversion starts once the first is over (the first holds until the hub lets it go,
    after the second was asked for and a thread hop had time to start it, were it let through)."""
    rule = Offload()
    order: list[str] = []
    entered, release = NativeEvent(), NativeEvent()

    def first() -> None:
        order.append("first in")
        entered.set()
        release.wait(10)
        order.append("first out")

    one = gevent.spawn(rule.run, WORK_ON_HUB + 1, first)
    assert call_in_thread(entered.wait, 10)
    two = gevent.spawn(rule.run, WORK_ON_HUB + 1, lambda: order.append("second"))
    call_in_thread(lambda: None)  # the second had its chance to start on a thread
    release.set()
    gevent.joinall([one, two], timeout=10, raise_error=True)
    assert order == ["first in", "first out", "second"]


def test_the_collector_is_paused_during_a_big_conversion_only() -> None:
    seen = []
    assert gc.isenabled()
    assert offload._without_collections(lambda x: seen.append(gc.isenabled()) or x, 7) == 7
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        offload._without_collections(lambda: seen.append(gc.isenabled()))
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_a_refusal_leaves_without_the_converters_frames() -> None:
    def refuse() -> None:
        raise TritonError.invalid_arg("no")

    with pytest.raises(TritonError) as info:
        Offload().run(WORK_ON_HUB + 1, refuse)
    assert info.value.__traceback__ is not None
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "refuse" not in frames

"""Native threads calling into the hub (``hub_port.py``) and the unpatched threading copy (``native_threads.py``)."""

from __future__ import annotations

import _queue
from collections.abc import Iterator

import gevent
import gevent.event
import pytest
from gevent import monkey

from triton_actor.actors.hub_port import HubPort
from triton_actor.actors.native_threads import NativeExecutor, native_threading

native_id = monkey.get_original("threading", "get_native_id")


@pytest.fixture
def port() -> Iterator[HubPort]:
    p = HubPort()
    yield p
    p.close()


def _wait(q: _queue.SimpleQueue, count: int) -> list[object]:
    """Collect ``count`` items a native thread puts, without blocking the hub."""
    out: list[object] = []
    while len(out) < count:
        try:
            out.append(q.get_nowait())
        except _queue.Empty:
            gevent.sleep(0.005)
    return out


@pytest.mark.timeout(30)
def test_native_threading_is_unpatched() -> None:
    threading = native_threading()
    assert threading is native_threading()
    seen: _queue.SimpleQueue = _queue.SimpleQueue()
    t = threading.Thread(target=lambda: seen.put(native_id()))
    t.start()
    assert _wait(seen, 1)[0] != native_id()  # a real OS thread, not a greenlet
    lock = threading.Lock()
    assert type(lock).__module__ != "gevent.thread"


@pytest.mark.timeout(30)
def test_calls_run_in_hub_greenlets_and_errors_come_back(port: HubPort) -> None:
    hub_tid = native_id()
    results: _queue.SimpleQueue = _queue.SimpleQueue()
    executor = NativeExecutor("t", max_workers=4)

    def on_hub(i: int) -> tuple[int, int]:
        gevent.sleep(0.001)  # a hub greenlet may block cooperatively
        return i, native_id()

    def boom() -> None:
        raise ValueError("nope")

    def worker(i: int) -> None:
        results.put(port.call(on_hub, i))
        try:
            port.call(boom)
        except ValueError as e:
            results.put(str(e))

    futures = [executor.submit(worker, i) for i in range(20)]
    got = _wait(results, 40)
    assert sorted(x for x in got if isinstance(x, tuple)) == [(i, hub_tid) for i in range(20)]
    assert got.count("nope") == 20
    done = gevent.event.Event()
    futures[-1].add_done_callback(lambda _f: port.post(done.set))
    assert done.wait(10)
    assert executor.threads <= 4
    executor.shutdown()


@pytest.mark.timeout(60)
def test_executor_grows_only_when_no_thread_waits() -> None:
    """Sequential short tasks (one grpc call at a time) keep reusing one thread: no creep."""
    executor = NativeExecutor("seq")
    done: _queue.SimpleQueue = _queue.SimpleQueue()
    for i in range(300):
        executor.submit(done.put, i)
        _wait(done, 1)
    assert executor.threads <= 2
    executor.shutdown()

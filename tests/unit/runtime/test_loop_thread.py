"""A Python model's asyncio loop on its own native thread (runtime/loop_thread.py): results and errors come
back to the waiting thread, a background run survives the garbage collector while it waits on a future
nobody else holds, and the loop's thread answers ``current_worker()`` as the instance that made it.

These hold under the server's patching (``threading`` native), which is where model code runs. Under the
test process's own patching (``threading`` too, for tritonclient's gRPC client) the loop's thread is woken
through a patched lock and the first ``wait`` never returns: so they are marked ``server_patching`` and
run in the child pytest of tests/unit/test_server_patching.py, patched as the server is.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from triton_actor.runtime import bridge, loop_thread
from triton_actor.runtime.loop_thread import LoopThread
from triton_actor.runtime.threads import NativeEvent

pytestmark = [pytest.mark.server_patching, pytest.mark.timeout(30)]


async def _value(x: int) -> int:
    await asyncio.sleep(0)  # a turn of the model's loop
    return x * 2


async def _fails() -> None:
    raise ValueError("from the coroutine")


def test_results_and_errors_come_back_to_the_waiting_thread() -> None:
    loop = LoopThread()
    try:
        assert loop.wait(_value(21)) == 42
        with pytest.raises(ValueError, match="from the coroutine"):
            loop.wait(_fails())
    finally:
        loop.close()


def test_a_background_run_waiting_on_a_future_only_it_holds_survives_a_collection() -> None:
    loop = LoopThread()
    waiting, finished, holder = NativeEvent(), NativeEvent(), []

    async def background() -> None:
        future = asyncio.get_running_loop().create_future()
        holder.append(future)
        waiting.set()
        await future
        finished.set()

    try:
        loop.submit(background())
        assert waiting.wait(10)
        future_ref = weakref.ref(holder.pop())
        gc.collect()
        future = future_ref()
        assert future is not None, "the waiting task and its future were collected"
        loop.loop.call_soon_threadsafe(future.set_result, None)
        assert finished.wait(10), "the background run was lost"
    finally:
        loop.close()


def test_the_loops_thread_acts_for_the_instance_that_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = object()
    monkeypatch.setattr(loop_thread, "current_worker", lambda: worker)  # made on an instance's thread
    acting = LoopThread()

    async def ask() -> object:
        return bridge.current_worker()

    try:
        assert acting.wait(ask()) is worker
    finally:
        acting.close()
    assert bridge.current_worker() is None

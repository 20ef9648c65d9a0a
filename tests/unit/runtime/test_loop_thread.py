"""A Python model's asyncio loop on its own native thread (runtime/loop_thread.py): results and errors come
back to the waiting thread, a background run survives the garbage collector while it waits on a future
nobody else holds, and the loop's thread answers ``current_worker()`` as the instance that made it.

The checks run in a child interpreter without gevent's patching, as the server runs model code (it
leaves ``threading`` native); this test process patches everything, and an asyncio loop woken from
another native thread does not work under that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECKS = r'''
import asyncio, gc, weakref
from triton_actor.runtime import bridge, loop_thread
from triton_actor.runtime.loop_thread import LoopThread
from triton_actor.runtime.threads import NativeEvent

async def value(x):
    await asyncio.sleep(0)
    return x * 2

async def fails():
    raise ValueError("from the coroutine")

loop = LoopThread()
assert loop.wait(value(21)) == 42
try:
    loop.wait(fails())
    raise AssertionError("no error")
except ValueError as e:
    assert str(e) == "from the coroutine"

# a background run waiting on a future only it holds survives a collection
waiting, finished, holder = NativeEvent(), NativeEvent(), []
async def background():
    future = asyncio.get_running_loop().create_future()
    holder.append(future)
    waiting.set()
    await future
    finished.set()
loop.submit(background())
assert waiting.wait(10)
future_ref = weakref.ref(holder.pop())
gc.collect()
future = future_ref()
assert future is not None, "the waiting task and its future were collected"
loop.loop.call_soon_threadsafe(future.set_result, None)
assert finished.wait(10), "the background run was lost"
loop.close()

# made on an instance's thread, the loop's thread acts for its worker
worker = object()
loop_thread.current_worker = lambda: worker
acting = LoopThread()
async def ask():
    return bridge.current_worker()
assert acting.wait(ask()) is worker
acting.close()
assert bridge.current_worker() is None
print("ok")
'''


def test_loop_thread_in_a_plain_interpreter() -> None:
    done = subprocess.run([sys.executable, "-c", CHECKS], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "ok", done.stderr

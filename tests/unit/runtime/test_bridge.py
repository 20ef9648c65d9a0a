"""The thread bridge (``triton_actor/runtime/bridge.py``): native worker threads and the hub."""

from __future__ import annotations

from collections.abc import Iterator

import gevent
import gevent.event
import pytest
from gevent import monkey

from triton_actor.errors import Code, TritonError
from triton_actor.runtime.bridge import NativeWorker, call_in_thread

native_id = monkey.get_original("threading", "get_native_id")
WAIT = 10.0


class SetupFailed(RuntimeError):
    pass


@pytest.fixture
def workers() -> Iterator[list[NativeWorker]]:
    made: list[NativeWorker] = []
    yield made
    for w in made:
        w.close(timeout=WAIT)


def _worker(made: list[NativeWorker], name: str, setup=lambda: "state", teardown=None) -> NativeWorker:
    w: NativeWorker = NativeWorker(name, setup=setup, teardown=teardown)
    made.append(w)
    return w


@pytest.mark.timeout(30)
def test_runs_on_its_own_native_thread(workers) -> None:
    hub_tid = native_id()
    w = _worker(workers, "w")
    assert w.ready.get(WAIT) is True
    state, tid = w.submit(lambda s: (s, native_id())).get(WAIT)
    assert state == "state"
    assert tid != hub_tid
    # every call runs on the same (single) native thread
    assert w.submit(lambda s: native_id()).get(WAIT) == tid
    assert w.thread_id is not None


@pytest.mark.timeout(30)
def test_setup_runs_in_the_worker_thread(workers) -> None:
    w = _worker(workers, "w", setup=native_id)
    assert w.ready.get(WAIT) is True
    setup_tid = w.submit(lambda s: s).get(WAIT)
    assert setup_tid == w.submit(lambda s: native_id()).get(WAIT)
    assert setup_tid != native_id()


@pytest.mark.timeout(30)
def test_setup_failure_propagates_via_ready(workers) -> None:
    def setup() -> str:
        raise SetupFailed("no device")

    w = _worker(workers, "broken", setup=setup)
    with pytest.raises(SetupFailed, match="no device"):
        w.ready.get(WAIT)
    # the thread is gone: stopped completes and close() returns promptly
    assert w.stopped.get(WAIT) is True
    assert w.close(timeout=WAIT) is True


@pytest.mark.timeout(30)
def test_submit_after_setup_failure_fails_instead_of_hanging(workers) -> None:
    def setup() -> str:
        raise SetupFailed("no device")

    w = _worker(workers, "broken", setup=setup)
    with pytest.raises(SetupFailed):
        w.ready.get(WAIT)
    reply = w.submit(lambda s: 1)
    with pytest.raises((SetupFailed, TritonError)) as info:  # the setup error or UNAVAILABLE ...
        reply.get(timeout=1.0)
    # ... but not the timeout of get() itself
    assert "no answer within" not in str(info.value), "the reply was never completed: nobody runs it"


@pytest.mark.timeout(30)
def test_fn_exception_propagates_and_worker_keeps_serving(workers) -> None:
    w = _worker(workers, "w")

    def bad(state: str, x: int) -> int:
        raise KeyError(f"missing {x}")

    with pytest.raises(KeyError, match="missing 3"):
        w.submit(bad, 3).get(WAIT)
    assert w.submit(lambda s, a, b: a + b, 2, 5).get(WAIT) == 7


@pytest.mark.timeout(60)
def test_100_concurrent_submits_on_two_workers(workers) -> None:
    pool = [_worker(workers, f"w{i}", setup=lambda i=i: f"worker{i}") for i in range(2)]
    for w in pool:
        w.ready.get(WAIT)

    def square(state: str, x: int) -> tuple[str, int, int]:
        return state, x * x, native_id()

    def client(i: int) -> tuple[int, tuple[str, int, int]]:
        return i, pool[i % 2].submit(square, i).get(WAIT)

    jobs = [gevent.spawn(client, i) for i in range(100)]
    gevent.joinall(jobs, timeout=WAIT * 3, raise_error=True)
    assert all(j.successful() for j in jobs)
    results = dict(j.value for j in jobs)
    assert sorted(results) == list(range(100))
    threads: dict[str, set[int]] = {"worker0": set(), "worker1": set()}
    for i, (state, value, tid) in results.items():
        assert state == f"worker{i % 2}"
        assert value == i * i
        threads[state].add(tid)
    # one native thread per worker, and they are different threads (and not the hub's)
    assert len(threads["worker0"]) == len(threads["worker1"]) == 1
    assert threads["worker0"].isdisjoint(threads["worker1"])
    assert native_id() not in threads["worker0"] | threads["worker1"]


@pytest.mark.timeout(30)
def test_submit_callback_calls_back_in_the_hub(workers) -> None:
    w = _worker(workers, "w")
    hub_tid = native_id()
    got: gevent.event.AsyncResult = gevent.event.AsyncResult()

    def done(ok: bool, value: object) -> None:
        got.set((ok, value, gevent.getcurrent() is gevent.get_hub(), native_id()))

    w.submit_callback(lambda s, x: (x, native_id()), (21,), done)
    ok, value, in_hub, tid = got.get(timeout=WAIT)
    assert ok is True
    assert value[0] == 21
    assert value[1] != hub_tid  # fn ran on the worker thread ...
    assert in_hub is True  # ... the callback in the hub greenlet,
    assert tid == hub_tid  # on the hub's native thread

    failed: gevent.event.AsyncResult = gevent.event.AsyncResult()

    def bad(state: str) -> None:
        raise ValueError("nope")

    w.submit_callback(bad, (), lambda ok, value: failed.set((ok, value)))
    ok, value = failed.get(timeout=WAIT)
    assert ok is False
    assert isinstance(value, ValueError)


@pytest.mark.timeout(30)
def test_close_finishes_queued_work_runs_teardown_and_joins() -> None:
    torn_down: list[tuple[str, int, int]] = []
    done_before_teardown: list[int] = []

    def work(state: str, i: int) -> int:
        done_before_teardown.append(i)
        return i

    def teardown(state: str) -> None:
        torn_down.append((state, native_id(), len(done_before_teardown)))

    w: NativeWorker = NativeWorker("w", setup=lambda: "state", teardown=teardown)
    worker_tid = w.submit(lambda s: native_id()).get(WAIT)
    replies = [w.submit(work, i) for i in range(10)]
    assert w.close(timeout=WAIT) is True
    # every queued call ran before teardown, in order, and their replies are complete
    assert [r.get(timeout=0) for r in replies] == list(range(10))
    assert torn_down == [("state", worker_tid, 10)]
    assert w.stopped.ready()


@pytest.mark.timeout(30)
def test_submit_after_close_fails_unavailable() -> None:
    w: NativeWorker = NativeWorker("closed", setup=lambda: None)
    w.ready.get(WAIT)
    assert w.close(timeout=WAIT) is True
    reply = w.submit(lambda s: 1)
    assert reply.ready()
    error = reply.exception()
    assert isinstance(error, TritonError) and error.code == Code.UNAVAILABLE
    got: list[tuple[bool, object]] = []
    w.submit_callback(lambda s: 1, (), lambda ok, value: got.append((ok, value)))
    assert len(got) == 1 and got[0][0] is False
    assert isinstance(got[0][1], TritonError) and got[0][1].code == Code.UNAVAILABLE
    # closing again is harmless
    assert w.close(timeout=WAIT) is True


@pytest.mark.timeout(30)
def test_teardown_failure_does_not_prevent_stop() -> None:
    def teardown(state: object) -> None:
        raise RuntimeError("teardown broke")

    w: NativeWorker = NativeWorker("w", setup=lambda: None, teardown=teardown)
    w.ready.get(WAIT)
    assert w.close(timeout=WAIT) is True


@pytest.mark.timeout(30)
def test_call_in_thread() -> None:
    hub_tid = native_id()
    value, tid = call_in_thread(lambda a, b: (a * b, native_id()), 6, 7)
    assert value == 42
    assert tid != hub_tid

    def boom() -> None:
        raise LookupError("from the pool")

    with pytest.raises(LookupError, match="from the pool"):
        call_in_thread(boom)


@pytest.mark.timeout(30)
def test_call_in_thread_blocks_only_the_calling_greenlet() -> None:
    lock = monkey.get_original("_thread", "allocate_lock")()
    lock.acquire()
    entered = gevent.event.Event()

    def blocking() -> str:
        # runs on a pool thread: wait for the hub to release us
        assert lock.acquire(timeout=WAIT)
        return "released"

    caller = gevent.spawn(call_in_thread, blocking)
    # another greenlet still runs while the call blocks its caller
    helper = gevent.spawn(entered.set)
    assert entered.wait(WAIT)
    helper.join(WAIT)
    assert not caller.ready()
    lock.release()
    assert caller.get(timeout=WAIT) == "released"


@pytest.mark.timeout(30)
def test_reply_completes_even_when_close_times_out() -> None:
    """close(timeout) may give up waiting, but work already submitted must still be answered when
    the thread finishes it: no reply is left pending forever."""
    lock = monkey.get_original("_thread", "allocate_lock")()
    lock.acquire()
    w: NativeWorker = NativeWorker("slow", setup=lambda: None)
    w.ready.get(WAIT)
    reply = w.submit(lambda s: "done" if lock.acquire(timeout=WAIT) else "lock timeout")
    assert w.close(timeout=0.05) is False  # the call is still blocked
    lock.release()
    assert reply.get(timeout=2.0) == "done"
    assert w.stopped.get(timeout=WAIT) is True


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["greenlet", "thread"])
def test_threads_a_job_starts_keep_running_while_the_worker_is_idle(workers, kind: str) -> None:
    """Model code on a worker may start a thread and return; that thread must go on running while the
    worker waits for its next job: decoupled models answer from such threads. Under the server's
    patching a ``threading.Thread`` is a native thread; a model that uses gevent (or ``threading`` where
    it is patched, as in the test process) starts a greenlet of the worker thread's own hub."""
    import threading
    import time

    from triton_actor.runtime.response_channel import ResponseChannel

    channel = ResponseChannel()

    def job(_state: str, n: int) -> str:
        def later() -> None:
            for i in range(n):
                time.sleep(0.01)  # the model's pace (time is patched: a greenlet yields to its hub)
                channel.send(i, i == n - 1)

        if kind == "greenlet":
            gevent.spawn(later)
        else:
            threading.Thread(target=later, daemon=True).start()
        return "started"

    w = _worker(workers, "w")
    assert w.submit(job, 3).get(timeout=WAIT) == "started"
    assert [channel.receive(timeout=WAIT) for _ in range(3)] == [(0, False), (1, False), (2, True)]
    assert w.submit(lambda s: s + "!").get(timeout=WAIT) == "state!"  # and it still takes jobs
    channel.close()


def _blocking_call(calls: object, fn: object, *args: object) -> object:
    """Native thread: what a model's BLS call does (wait_on_hub), its answer or error returned."""
    from triton_actor.runtime.hub_calls import wait_on_hub

    try:
        return ("ok", wait_on_hub(calls, fn, *args))  # type: ignore[arg-type]
    except Exception as e:
        return ("error", e)


def _on_hub(value: int) -> tuple[int, bool]:
    gevent.sleep(0.01)  # a greenlet on the hub may yield while the native thread waits
    return value * 2, gevent.getcurrent() is not gevent.get_hub()


def _fails() -> None:
    raise TritonError.invalid_arg("refused")


@pytest.mark.timeout(30)
def test_a_native_thread_waits_for_a_call_on_the_hub(workers) -> None:
    from triton_actor.runtime.bridge import current_worker
    from triton_actor.runtime.hub_calls import HubCalls

    calls = HubCalls()
    try:
        w = _worker(workers, "caller")
        assert w.submit(lambda _s: current_worker() is w).get(WAIT)  # the thread knows its worker
        assert current_worker() is None  # the hub is no worker's thread
        assert w.submit(lambda _s: _blocking_call(calls, _on_hub, 21)).get(WAIT) == ("ok", (42, True))
        status, error = w.submit(lambda _s: _blocking_call(calls, _fails)).get(WAIT)
        assert status == "error" and isinstance(error, TritonError) and error.code == Code.INVALID_ARG

        def in_own_hub(_s: object) -> object:
            gevent.sleep(0)  # this thread now has a gevent hub of its own: the wait is cooperative
            side = gevent.spawn(lambda: "side greenlet ran")
            answer = _blocking_call(calls, _on_hub, 1)
            return answer, side.get(timeout=WAIT)

        assert w.submit(in_own_hub).get(WAIT) == (("ok", (2, True)), "side greenlet ran")
        assert w.used_hub
    finally:
        calls.close()


def _greenlet_exits_later(state: str) -> str:
    """Worker thread: leave a greenlet on this thread's hub that calls sys.exit() once the job returned
    (gevent re-raises its SystemExit in the thread's main greenlet: the worker, waiting for work)."""
    import sys

    gevent.spawn(sys.exit, "the job's greenlet exits")
    return state


@pytest.mark.timeout(30)
def test_a_system_exit_thrown_into_the_idle_worker_does_not_end_it(workers) -> None:
    w = _worker(workers, "w")
    for _ in range(3):
        assert w.submit(_greenlet_exits_later).get(WAIT) == "state"
        assert w.submit(lambda s: s + "!").get(WAIT) == "state!"  # before the fix: never answered
    assert w.died is None and not w.stopped.ready()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("error", [SystemExit("bye"), KeyboardInterrupt("stop")])
def test_a_base_exception_of_a_call_reaches_the_hub_as_internal(workers, error: BaseException) -> None:
    """Raised in a hub greenlet, SystemExit / KeyboardInterrupt would end the process (gevent re-raises
    them in the main greenlet): the reply fails with INTERNAL naming them instead."""
    w = _worker(workers, "w")

    def bad(state: str) -> None:
        raise error

    with pytest.raises(TritonError) as info:
        w.submit(bad).get(WAIT)
    assert info.value.code == Code.INTERNAL and repr(error) in info.value.message
    assert w.submit(lambda s: s).get(WAIT) == "state"


class _LoopFails(NativeWorker):
    """A worker whose loop breaks (a bug of ours) at its second wait for work."""

    def __init__(self, *args, **kwargs) -> None:
        self.waits = 0
        super().__init__(*args, **kwargs)

    def _next_item(self):
        self.waits += 1
        if self.waits == 2:
            raise RuntimeError("the loop broke")
        return super()._next_item()


@pytest.mark.timeout(30)
def test_a_worker_whose_loop_fails_answers_everything_and_reports_why(workers) -> None:
    gate = gevent.event.Event()
    w = _LoopFails("w", setup=lambda: "state")
    workers.append(w)
    first = w.submit(lambda s: s)
    assert first.get(WAIT) == "state"
    assert w.stopped.get(WAIT) is True
    assert isinstance(w.died, RuntimeError) and "the loop broke" in str(w.died)
    with pytest.raises(TritonError) as info:
        w.submit(lambda s: s).get(WAIT)  # after it died: at once, not never
    assert info.value.code == Code.UNAVAILABLE
    answers: list = []
    w.submit_callback(lambda s: s, (), lambda ok, value: (answers.append((ok, value)), gate.set()))
    assert gate.wait(WAIT) and answers[0][0] is False


def test_call_in_thread_keeps_nothing_of_its_callers_or_their_results() -> None:
    """Neither an error (raised from a name: a cycle through call_in_thread's frame and every caller's)
    nor a result (gevent's pool kept the last one until its next task) outlives its caller."""
    import gc
    import weakref

    class Held:
        pass

    def fail() -> None:
        raise ValueError("refused")

    def caller() -> tuple[weakref.ref, weakref.ref]:
        held = Held()
        try:
            call_in_thread(fail)
        except ValueError:
            pass
        return weakref.ref(held), weakref.ref(call_in_thread(Held))

    collecting = gc.isenabled()
    gc.disable()
    try:
        assert [ref() for ref in caller()] == [None, None]
    finally:
        if collecting:
            gc.enable()

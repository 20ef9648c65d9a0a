"""The batch thread that takes records from the hub (runtime/batch_thread.py; OpenTelemetry's spans go
through it): records handled in the order they were put, a batch as soon as ``wake_at`` wait, a full
queue dropping and counting (and saying so in the log), :meth:`flush` and :meth:`close` waiting for what
was put before them, a failing ``handle`` costing its batch only."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from triton_actor.runtime.batch_thread import BatchThread
from triton_actor.runtime.threads import NativeEvent

pytestmark = pytest.mark.timeout(30)
_NEVER = 3600.0  # a delay no test waits for: batches come from wake_at, flush or close


class Sink:
    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[list[Any]] = []
        self.entered, self.gate, self.got = NativeEvent(), NativeEvent(), NativeEvent()
        self.gate.set()
        self.fail_first = fail_first

    def __call__(self, batch: list[Any]) -> None:
        self.entered.set()
        self.gate.wait()
        if self.fail_first:
            self.fail_first = False
            raise ValueError("the sink is down")
        self.batches.append(batch)
        self.got.set()


def test_records_are_handled_in_order_a_batch_when_wake_at_wait() -> None:
    sink = Sink()
    thread = BatchThread("test", sink, max_queue=100, wake_at=3, delay_s=_NEVER)
    try:
        for i in range(3):
            thread.put(i)
        assert sink.got.wait(10)  # woken by the third record, not by the delay
        assert sink.batches == [[0, 1, 2]]
        thread.put(3)
        thread.put(4)
        assert thread.flush()
        assert sink.batches == [[0, 1, 2], [3, 4]] and thread.dropped == 0
    finally:
        thread.close()


def test_a_full_queue_drops_counts_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink()
    sink.gate = NativeEvent()  # the sink holds its first batch until the test lets it go
    thread = BatchThread("test spans", sink, max_queue=2, wake_at=2, delay_s=_NEVER)
    try:
        thread.put("a")
        thread.kick()
        assert sink.entered.wait(10)  # "a" is taken: the queue is empty again, and stuck behind the sink
        for record in ("b", "c", "d", "e"):
            thread.put(record)
        assert thread.dropped == 2  # "d" and "e": two were waiting
        with caplog.at_level(logging.WARNING, logger="triton_actor.runtime.batch_thread"):
            sink.gate.set()
            assert thread.flush()
        assert sink.batches == [["a"], ["b", "c"]]
        assert "test spans: 2 dropped (more than 2 waiting); 2 in all" in caplog.text
    finally:
        thread.close()


def test_drops_are_counted_in_the_units_weigh_gives() -> None:
    """OpenTelemetry counts spans: a model's record holds two (observability/otel.py ``_spans_in``)."""
    sink = Sink()
    thread = BatchThread("test spans", sink, max_queue=1, wake_at=100, delay_s=_NEVER, weigh=len)
    try:
        for record in ("a", "bb", "ccc"):  # "a" waits; the two after it are dropped
            thread.put(record)
        assert thread.dropped == 5
    finally:
        thread.close()


def test_close_handles_what_was_put_and_drops_what_comes_after() -> None:
    sink = Sink()
    thread = BatchThread("test", sink, max_queue=100, wake_at=100, delay_s=_NEVER)
    thread.put(1)
    thread.put(2)
    assert thread.close()
    assert sink.batches == [[1, 2]]
    thread.put(3)
    assert thread.dropped == 1 and thread.flush()  # no thread to wait for: flush answers at once
    assert sink.batches == [[1, 2]]


def test_a_failing_handle_costs_its_batch_only(caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(fail_first=True)
    thread = BatchThread("test", sink, max_queue=100, wake_at=100, delay_s=_NEVER)
    try:
        with caplog.at_level(logging.ERROR, logger="triton_actor.runtime.batch_thread"):
            thread.put("lost")
            assert thread.flush()
        assert "handling 1 records failed" in caplog.text and "the sink is down" in caplog.text
        thread.put("kept")
        assert thread.flush()
        assert sink.batches == [["kept"]]
    finally:
        thread.close()

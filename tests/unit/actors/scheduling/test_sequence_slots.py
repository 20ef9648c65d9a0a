"""SequenceSlots with a manual clock: slot allocation, backlog, direct and oldest batches, idle timeout."""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor.actors.scheduling.sequence_controls import SequenceTensors
from triton_actor.actors.scheduling.sequence_slots import SEQUENCE_END, SEQUENCE_START, SequenceSlots, SlotPolicy
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.repository.config import parse_text

MS = 1_000_000


def _slots(**kw: object) -> SequenceSlots[str]:
    return SequenceSlots(SlotPolicy(**kw))  # type: ignore[arg-type]


def _items(batch: list) -> list:
    return [s.item for s in batch]


def test_first_request_needs_start() -> None:
    slots = _slots()
    with pytest.raises(TritonError) as e:
        slots.add("a1", 7, 0, 0, "m")
    assert e.value.code == Code.INVALID_ARG
    assert e.value.message == ("inference request for sequence 7 to model 'm' must specify the START flag on the "
                               "first request of the sequence")


def test_queued_requests_are_bounded_across_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client opening sequences faster than they run fills the backlog only up to the bound."""
    from triton_actor.actors.scheduling import sequence_slots

    monkeypatch.setattr(sequence_slots, "MAX_QUEUED", 3)
    slots = _slots()
    for corr_id in (1, 2, 3):
        slots.add(f"s{corr_id}", corr_id, SEQUENCE_START, 0, "m")
    with pytest.raises(TritonError) as e:
        slots.add("s4", 4, SEQUENCE_START, 0, "m")
    assert e.value.code == Code.UNAVAILABLE and e.value.message == "Exceeds maximum queue size"
    assert len(slots) == 3 and slots.backlog + slots.active == 3


def test_direct_binds_a_sequence_to_a_slot_and_pads_gaps_with_none() -> None:
    slots = _slots(slots=3, max_batch_size=3)
    for i, corr in enumerate((1, 2, 3)):
        slots.add(f"s{corr}", corr, SEQUENCE_START, i, "m")
    batch, wait = slots.take(0, 10)
    assert _items(batch) == ["s1", "s2", "s3"] and wait is None
    for corr in (1, 2, 3):
        slots.completed(corr, 11, release=False)
    slots.add("3b", 3, 0, 12, "m")  # only slot 2 has work: slots 0 and 1 are empty entries
    batch, _ = slots.take(0, 13)
    assert _items(batch) == [None, None, "3b"] and batch[2].corr_id == 3


def test_end_frees_the_slot_for_the_backlog_in_arrival_order() -> None:
    slots = _slots(slots=1)
    slots.add("a", 1, SEQUENCE_START, 0, "m")
    slots.add("b", 2, SEQUENCE_START, 1, "m")
    slots.add("c", 3, SEQUENCE_START, 2, "m")
    assert (slots.active, slots.backlog) == (1, 2)
    batch, _ = slots.take(0, 3)
    assert _items(batch) == ["a"]
    slots.completed(1, 4, release=False)
    slots.add("a-end", 1, SEQUENCE_END, 5, "m")
    assert _items(slots.take(0, 6)[0]) == ["a-end"]
    assert slots.take(0, 6) == ([], None)  # b waits until a's END completed
    assert slots.completed(1, 7, release=False) is True
    assert _items(slots.take(0, 8)[0]) == ["b"]  # the oldest backlog sequence got the slot
    with pytest.raises(TritonError):
        slots.add("a-again", 1, 0, 9, "m")  # a ended: it must START again


def test_sequences_spread_over_instances() -> None:
    slots = _slots(instances=2, slots=2, max_batch_size=2)
    for corr in (1, 2):
        slots.add(f"s{corr}", corr, SEQUENCE_START, 0, "m")
    assert _items(slots.take(0, 1)[0]) == ["s1"]
    assert _items(slots.take(1, 1)[0]) == ["s2"]


def test_direct_waits_for_slot_utilization_at_most_the_delay() -> None:
    slots = _slots(slots=4, max_batch_size=4, max_delay_ns=10 * MS, min_utilization=0.5)
    slots.add("a", 1, SEQUENCE_START, 0, "m")
    assert slots.take(0, 2 * MS) == ([], 8 * MS)
    slots.add("b", 2, SEQUENCE_START, 3 * MS, "m")  # 2 of 4 slots ready: utilization reached
    assert _items(slots.take(0, 4 * MS)[0]) == ["a", "b"]
    slots.completed(1, 5 * MS, release=False)
    slots.completed(2, 5 * MS, release=False)
    slots.add("a2", 1, 0, 6 * MS, "m")
    assert slots.take(0, 7 * MS)[0] == []
    assert _items(slots.take(0, 16 * MS)[0]) == ["a2"]  # the delay passed: runs below the utilization


def test_oldest_takes_the_oldest_heads_up_to_a_preferred_size() -> None:
    slots = _slots(slots=4, oldest=True, max_batch_size=4, preferred=(2,), max_delay_ns=100 * MS)
    slots.add("late", 1, SEQUENCE_START, 5, "m")
    assert slots.take(0, 6) == ([], 100 * MS - 1)  # alone: waits for a second one
    slots.add("early", 2, SEQUENCE_START, 3, "m")  # enqueued earlier (clock of its arrival)
    slots.add("third", 3, SEQUENCE_START, 7, "m")
    batch, _ = slots.take(0, 8)
    assert _items(batch) == ["early", "late"]  # oldest first, cut to the preferred size
    assert _items(slots.take(0, 100 * MS + 7)[0]) == ["third"]  # after the delay whatever is there


def test_oldest_sends_one_request_per_sequence() -> None:
    slots = _slots(slots=2, oldest=True, max_batch_size=4)
    slots.add("a1", 1, SEQUENCE_START, 0, "m")
    slots.add("a2", 1, 0, 1, "m")
    assert _items(slots.take(0, 2)[0]) == ["a1"]
    slots.completed(1, 3, release=False)
    assert _items(slots.take(0, 4)[0]) == ["a2"]


def test_idle_sequences_are_released() -> None:
    slots = _slots(slots=1, idle_ns=100 * MS)
    slots.add("a", 1, SEQUENCE_START, 0, "m")
    slots.add("b", 2, SEQUENCE_START, 0, "m")  # backlog
    slots.take(0, 1)
    assert slots.next_idle_ns(2) is None  # running: cannot time out
    slots.completed(1, 10 * MS, release=False)
    assert slots.next_idle_ns(10 * MS) == 100 * MS
    assert slots.expire(109 * MS) == []
    assert slots.expire(110 * MS) == [1]
    assert _items(slots.take(0, 111 * MS)[0]) == ["b"]


def test_iterative_requeue_keeps_the_slot_until_released() -> None:
    slots = _slots(slots=1, iterative=True)
    slots.add("r", 1, SEQUENCE_START | SEQUENCE_END, 0, "m")
    batch, _ = slots.take(0, 1)
    assert batch[0].flags == SEQUENCE_START | SEQUENCE_END
    slots.requeue("r", 1, 2)
    assert slots.completed(1, 2, release=False) is False
    batch, _ = slots.take(0, 3)
    assert batch[0].flags == 0  # rescheduled: neither START nor END
    assert slots.completed(1, 4, release=True) is True
    assert slots.active == 0


CONFIG = """
name: "m"
max_batch_size: 2
input [{ name: "X" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [1] }]
sequence_batching {
  control_input [
    { name: "S" control [{ kind: CONTROL_SEQUENCE_START bool_false_true: [false, true] }] },
    { name: "R" control [{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [-1, 2] }] },
    { name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }] }
  ]
  state [{ input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [2] }]
}
"""


def test_control_tensors_in_the_configured_types(tmp_path) -> None:
    tensors = SequenceTensors.from_config(parse_text(CONFIG, "m", "config.pbtxt"), tmp_path)
    got = tensors.controls_for("abc", SEQUENCE_START, True)
    assert got["S"].data.dtype == np.bool_ and got["S"].data.tolist() == [[True]]
    assert got["R"].data.dtype == np.float32 and got["R"].data.tolist() == [[2.0]]
    assert got["C"].data.tolist() == [[b"abc"]] and got["C"].dtype.wire == "BYTES"
    assert tensors.controls_for("", 0, False)["R"].data.tolist() == [[-1.0]]
    state = tensors.state_inputs(None)["I"]
    assert state.shape == (1, 2) and state.data.tolist() == [[0.0, 0.0]]
    shown, saved = tensors.take_states(InferResponse([("Y", np.ones(1)), ("O", np.full((1, 2), 3.0))]))
    assert [n for n, _ in shown.outputs] == ["Y"] and saved["I"].tolist() == [[3.0, 3.0]]


@pytest.mark.parametrize("control", [
    "{ kind: CONTROL_SEQUENCE_START int32_false_true: [0] }",
    "{ kind: CONTROL_SEQUENCE_END }",
    "{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 }",
])
def test_bad_controls_are_refused_at_load(tmp_path, control: str) -> None:
    text = CONFIG.replace('{ kind: CONTROL_SEQUENCE_START bool_false_true: [false, true] }', control)
    with pytest.raises(TritonError) as e:
        SequenceTensors.from_config(parse_text(text, "m", "config.pbtxt"), tmp_path)
    assert e.value.code == Code.INVALID_ARG


def test_cancel_ends_the_sequence_and_returns_its_queued_requests() -> None:
    slots = _slots(slots=1)
    slots.add("a1", 1, SEQUENCE_START, 0, "m")
    slots.add("b1", 2, SEQUENCE_START, 0, "m")  # backlog
    slots.take(0, 1)
    slots.add("a2", 1, 0, 2, "m")
    slots.add("a3", 1, 0, 3, "m")
    assert slots.cancel(1) == ["a2", "a3"] and len(slots) == 1
    assert _items(slots.take(0, 4)[0]) == ["b1"]  # the slot went to the backlog
    with pytest.raises(TritonError):
        slots.add("a4", 1, 0, 5, "m")


def test_numeric_corrid_in_a_narrower_type_wraps(tmp_path) -> None:
    text = CONFIG.replace("data_type: TYPE_STRING", "data_type: TYPE_INT32")
    tensors = SequenceTensors.from_config(parse_text(text, "m", "config.pbtxt"), tmp_path)
    assert tensors.controls_for(2**32 + 7, 0, True)["C"].data.tolist() == [[7]]
    assert tensors.controls_for("text", 0, True)["C"].data.tolist() == [[0]]


def test_a_sequence_active_again_is_not_expired_by_an_earlier_idle_check() -> None:
    slots = _slots(slots=2, idle_ns=100 * MS)
    slots.add("a", 1, SEQUENCE_START, 0, "m")
    slots.add("b", 2, SEQUENCE_START, 0, "m")
    slots.take(0, 1)
    slots.completed(1, 10 * MS, release=False)
    slots.completed(2, 50 * MS, release=False)
    slots.add("a2", 1, 0, 60 * MS, "m")  # 1 is busy again before its idle time
    assert slots.expire(110 * MS) == []  # the check due for 1 finds it busy
    assert slots.next_idle_ns(110 * MS) == 40 * MS  # 2 is next: idle since 50 ms
    assert slots.expire(150 * MS) == [2]


def test_a_closed_instance_ends_its_sequences_and_takes_no_new_ones() -> None:
    """An instance out of the pool (its thread or process died): the sequences it held end, their queued
    requests come back to be failed; new sequences go to the other instance until it is opened again."""
    slots = _slots(instances=2)
    slots.add("a1", 1, SEQUENCE_START, 0, "m")  # instance 0 (least loaded, lowest index)
    slots.add("b1", 2, SEQUENCE_START, 0, "m")  # instance 1
    assert _items(slots.take(0, 0)[0]) == ["a1"] and _items(slots.take(1, 0)[0]) == ["b1"]
    slots.add("a2", 1, 0, 0, "m")
    assert slots.close_instance(0) == ([1], ["a2"])
    assert len(slots) == 0 and slots.active == 1
    with pytest.raises(TritonError):  # the sequence is over: its next request needs START again
        slots.add("a3", 1, 0, 0, "m")
    slots.add("c1", 3, SEQUENCE_START, 0, "m")  # instance 1 is busy with sequence 2: c waits in the backlog
    assert slots.backlog == 1 and slots.take(0, 0) == ([], None)
    slots.add("b2", 2, SEQUENCE_END, 0, "m")
    slots.completed(2, 0, release=False)
    assert _items(slots.take(1, 0)[0]) == ["b2"]
    slots.completed(2, 0, release=False)  # b ended: its slot goes to c, on instance 1
    assert slots.backlog == 0 and _items(slots.take(1, 0)[0]) == ["c1"]
    slots.open_instance(0)
    slots.add("d1", 4, SEQUENCE_START, 0, "m")
    assert _items(slots.take(0, 0)[0]) == ["d1"]

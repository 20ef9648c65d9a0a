"""BatchQueue (``triton_actor/actors/scheduling/batch_queue.py``): batch formation with a manual clock.

Every test drives ``poll(now_ns)`` with explicit times, so nothing here depends on the machine's speed.
Items are strings; a request's batch size, shape key, priority and timeout are given to ``add``.
"""

from __future__ import annotations

import pytest

from triton_actor.actors.scheduling.batch_queue import BatchPolicy, BatchQueue, QueuePolicy
from triton_actor.actors.scheduling.scheduler import _shape_key
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest
from triton_actor.repository.config import parse_text


def _cfg(text: str):
    return parse_text(text, "m", "config.pbtxt")

US = 1_000
MS = 1_000_000


def _queue(mbs: int = 8, preferred: tuple[int, ...] = (), delay_us: int = 0, **kw) -> BatchQueue[str]:
    return BatchQueue(BatchPolicy(max_batch_size=mbs, preferred=preferred or ((mbs,) if mbs else ()),
                                  max_delay_ns=delay_us * US, **kw))


def _add(q: BatchQueue[str], name: str, now: int, size: int = 1, key: object = "k", priority: int = 0,
         timeout_us: int = 0) -> None:
    q.add(name, size, key, priority, timeout_us, now)


# -- default scheduler and delay 0 ------------------------------------------------------------------
def test_without_batching_each_request_runs_alone_in_order() -> None:
    q = _queue(mbs=0)
    for name in "abc":
        _add(q, name, 0)
    assert [q.poll(0).batch for _ in range(4)] == [["a"], ["b"], ["c"], []]


def test_delay_zero_takes_whatever_is_queued_now() -> None:
    q = _queue(mbs=8)
    for name in "abc":
        _add(q, name, 0)
    d = q.poll(0)
    assert d.batch == ["a", "b", "c"] and d.wait_ns is None
    assert len(q) == 0 and q.poll(0).batch == []


def test_batch_never_exceeds_max_batch_size_and_requests_are_never_split() -> None:
    q = _queue(mbs=8)
    for name, size in (("a", 3), ("b", 4), ("c", 2), ("d", 8)):
        _add(q, name, 0, size=size)
    assert q.poll(0).batch == ["a", "b"]  # 3 + 4 = 7; "c" (2) would make 9
    assert q.poll(0).batch == ["c"]  # "d" (8) would make 10
    assert q.poll(0).batch == ["d"]


def test_request_larger_than_every_preferred_size_runs_alone() -> None:
    q = _queue(mbs=8, preferred=(2,), delay_us=1000)
    _add(q, "big", 0, size=6)
    assert q.poll(0).batch == ["big"]


def test_different_shapes_are_not_batched_together() -> None:
    q = _queue(mbs=8)
    _add(q, "a", 0, key=(4,))
    _add(q, "b", 0, key=(4,))
    _add(q, "c", 0, key=(5,))
    _add(q, "d", 0, key=(4,))
    assert q.poll(0).batch == ["a", "b"]  # the walk stops at the first other shape: order is kept
    assert q.poll(0).batch == ["c"]
    assert q.poll(0).batch == ["d"]


def test_ragged_inputs_do_not_split_batches() -> None:
    cfg = _cfg("""
        max_batch_size: 8
        input [ { name: "R", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true },
                { name: "F", data_type: TYPE_FP32, dims: [ -1 ] } ]
        dynamic_batching { }
    """)
    policy = BatchPolicy.from_config(cfg)
    assert policy.ragged_inputs == frozenset({"R"})
    def req(r: int, f: int) -> InferRequest:
        return InferRequest("m", 1, "", {"R": InferInput("R", None, (1, r), None), "F": InferInput("F", None, (1, f), None)})

    assert _shape_key(req(3, 2), policy.ragged_inputs) == _shape_key(req(7, 2), policy.ragged_inputs)
    swapped = req(3, 2)._replace(inputs=dict(reversed(list(req(3, 2).inputs.items()))))
    assert _shape_key(swapped, policy.ragged_inputs) == _shape_key(req(3, 2), policy.ragged_inputs)  # order-free
    assert _shape_key(req(3, 2), policy.ragged_inputs) != _shape_key(req(3, 5), policy.ragged_inputs)


# -- preferred sizes and the queue delay ---------------------------------------------------------------
def test_waits_for_the_delay_when_below_every_preferred_size() -> None:
    q = _queue(mbs=8, preferred=(4, 8), delay_us=500)
    _add(q, "a", 0)
    d = q.poll(0)
    assert d.batch == [] and d.wait_ns == 500 * US
    _add(q, "b", 100 * US)
    d = q.poll(100 * US)
    assert d.batch == [] and d.wait_ns == 400 * US  # the oldest request's delay counts
    d = q.poll(500 * US)
    assert d.batch == ["a", "b"]  # delay exceeded: send what is pending


def test_preferred_size_is_sent_at_once() -> None:
    q = _queue(mbs=8, preferred=(4, 8), delay_us=10_000)
    for i in range(4):
        _add(q, f"r{i}", 0)
    assert q.poll(0).batch == ["r0", "r1", "r2", "r3"]


def test_largest_prefix_of_a_preferred_size_is_sent_and_the_rest_waits() -> None:
    q = _queue(mbs=8, preferred=(2, 4), delay_us=10_000)
    for i in range(5):
        _add(q, f"r{i}", 0)
    d = q.poll(0)
    assert d.batch == ["r0", "r1", "r2", "r3"]
    d = q.poll(0)
    assert d.batch == [] and d.wait_ns == 10_000 * US  # r4 alone is below every preferred size


def test_preferred_prefix_respects_request_sizes() -> None:
    q = _queue(mbs=8, preferred=(4,), delay_us=10_000)
    _add(q, "a", 0, size=3)
    _add(q, "b", 0, size=2)  # 3 + 2 passes the preferred 4 without hitting it
    d = q.poll(0)
    assert d.batch == ["a"]  # the prefix that did not exceed the largest preferred size goes now


def test_delay_exceeded_sends_everything_that_fits_not_just_the_preferred_prefix() -> None:
    q = _queue(mbs=8, preferred=(2,), delay_us=100)
    for i in range(3):
        _add(q, f"r{i}", 0)
    assert q.poll(200 * US).batch == ["r0", "r1", "r2"]


def test_batch_reaching_max_batch_size_goes_without_waiting() -> None:
    q = _queue(mbs=4, preferred=(3,), delay_us=10_000)
    _add(q, "a", 0, size=2)
    _add(q, "b", 0, size=2)
    assert q.poll(0).batch == ["a"]  # 2 + 2 > preferred 3: the mark is the prefix before "b"


def test_from_config_defaults_preferred_to_max_batch_size() -> None:
    cfg = _cfg("max_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 250 }")
    policy = BatchPolicy.from_config(cfg)
    assert policy.max_batch_size == 16 and policy.preferred == (16,) and policy.max_delay_ns == 250 * US
    assert BatchPolicy.from_config(_cfg("max_batch_size: 16")).max_batch_size == 0  # no block: no batching


# -- priorities -----------------------------------------------------------------------------------------
def _levels(**kw) -> BatchQueue[str]:
    return _queue(mbs=0, priority_levels=3, default_priority=2,
                  policies={level: QueuePolicy() for level in (1, 2, 3)}, **kw)


def test_higher_priority_runs_first_and_fifo_within_a_level() -> None:
    q = _levels()
    _add(q, "low", 0, priority=3)
    _add(q, "mid1", 0, priority=2)
    _add(q, "high", 0, priority=1)
    _add(q, "mid2", 0, priority=2)
    assert [q.poll(0).batch[0] for _ in range(4)] == ["high", "mid1", "mid2", "low"]


@pytest.mark.parametrize("priority", [0, 4, 99])
def test_priority_zero_or_beyond_the_levels_falls_back_to_the_default(priority: int) -> None:
    q = _levels()
    _add(q, "low", 0, priority=3)
    _add(q, "x", 0, priority=priority)
    _add(q, "mid", 0, priority=2)
    assert q.level_of(priority) == 2
    assert [q.poll(0).batch[0] for _ in range(3)] == ["x", "mid", "low"]


def test_batches_cross_priority_levels_in_priority_order() -> None:
    q = BatchQueue(BatchPolicy(max_batch_size=4, preferred=(4,), priority_levels=2, default_priority=1,
                               policies={1: QueuePolicy(), 2: QueuePolicy()}))
    _add(q, "low", 0, priority=2)
    _add(q, "high", 0, priority=1)
    assert q.poll(0).batch == ["high", "low"]


# -- queue policies ----------------------------------------------------------------------------------
def test_full_queue_rejects_with_tritons_message_and_frees_after_dispatch() -> None:
    q = _queue(mbs=0, policies={1: QueuePolicy(max_queue_size=2)})
    _add(q, "a", 0)
    _add(q, "b", 0)
    with pytest.raises(TritonError) as e:
        _add(q, "c", 0)
    assert e.value.code == Code.UNAVAILABLE and e.value.message == "Exceeds maximum queue size"
    assert q.poll(0).batch == ["a"]
    _add(q, "c", 0)  # a slot is free again
    assert len(q) == 2


def test_full_queue_is_per_priority_level() -> None:
    q = _queue(mbs=0, priority_levels=2, default_priority=2,
               policies={1: QueuePolicy(), 2: QueuePolicy(max_queue_size=1)})
    _add(q, "low", 0, priority=2)
    with pytest.raises(TritonError):
        _add(q, "low2", 0, priority=2)
    _add(q, "high", 0, priority=1)  # level 1 is unbounded


def test_timeout_reject_expires_the_request_and_frees_its_slot() -> None:
    q = _queue(mbs=8, preferred=(8,), delay_us=10_000,
               policies={1: QueuePolicy(default_timeout_ns=1 * MS, max_queue_size=2)})
    _add(q, "a", 0)
    d = q.poll(0)
    assert d.batch == [] and d.wait_ns == 1 * MS  # woken for the timeout before the 10 ms delay
    _add(q, "b", 500 * US)
    d = q.poll(1 * MS)
    assert d.expired == ["a"] and d.batch == [] and len(q) == 1
    assert q.until_deadline(1 * MS) == 500 * US
    _add(q, "c", 1 * MS)  # the expired request's slot is free
    assert q.expire(1500 * US) == ["b"]


def test_timeout_delay_moves_the_request_behind_unexpired_ones() -> None:
    q = _queue(mbs=0, policies={1: QueuePolicy(delay_on_timeout=True, default_timeout_ns=1 * MS)})
    _add(q, "a", 0)
    _add(q, "b", 900 * US)
    assert q.expire(1 * MS) == []  # DELAY: nothing is rejected...
    assert q.until_deadline(1 * MS) == 900 * US
    assert [q.poll(1 * MS).batch[0] for _ in range(2)] == ["b", "a"]  # ...but "a" now comes after "b"


def test_request_timeout_override_only_shortens_a_default() -> None:
    long_default = QueuePolicy(default_timeout_ns=10 * MS, allow_timeout_override=True)
    assert long_default.deadline(0, 2_000) == 2 * MS
    assert long_default.deadline(0, 50_000) == 10 * MS
    assert long_default.deadline(0, 0) == 10 * MS
    no_default = QueuePolicy(allow_timeout_override=True)
    assert no_default.deadline(0, 3_000) > 10 ** 15  # no default, no timeout: Triton's PolicyQueue::Enqueue
    not_allowed = QueuePolicy(default_timeout_ns=10 * MS)
    assert not_allowed.deadline(0, 1_000) == 10 * MS


def test_clear_returns_every_queued_request() -> None:
    q = _levels()
    _add(q, "a", 0, priority=3)
    _add(q, "b", 0, priority=1)
    assert q.clear() == ["b", "a"] and len(q) == 0 and q.poll(0).batch == []


def test_queue_policies_from_config() -> None:
    cfg = _cfg("""
        max_batch_size: 8
        dynamic_batching {
          priority_levels: 2 default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100 max_queue_size: 5 }
          priority_queue_policy { key: 1 value: { allow_timeout_override: true } }
        }
    """)
    policy = BatchPolicy.from_config(cfg)
    assert policy.priority_levels == 2 and policy.default_priority == 2
    assert policy.policies[2] == QueuePolicy(delay_on_timeout=True, default_timeout_ns=100 * US, max_queue_size=5)
    assert policy.policies[1] == QueuePolicy(allow_timeout_override=True)

"""ReplyOrder (``triton_actor/actors/scheduling/reply_order.py``): preserve_ordering's release of replies, as a spec."""

from __future__ import annotations

from typing import Any

from triton_actor.actors.scheduling.reply_order import ReplyOrder


def make() -> tuple[ReplyOrder[str], list[tuple[str, bool, Any]]]:
    completed: list[tuple[str, bool, Any]] = []
    return ReplyOrder(lambda item, ok, value: completed.append((item, ok, value))), completed


def test_replies_complete_in_dispatch_order_whatever_order_they_finish_in() -> None:
    order, completed = make()
    order.dispatched(["a", "b"])
    order.dispatched(["c"])
    order.finished("c", True, 3)
    order.finished("b", False, "error")
    assert completed == []
    order.finished("a", True, 1)
    assert completed == [("a", True, 1), ("b", False, "error"), ("c", True, 3)]


def test_a_place_given_up_holds_nobody_and_the_request_takes_a_new_one() -> None:
    order, completed = make()
    order.dispatched(["a", "b"])
    order.finished("b", True, 2)
    order.give_up("a")  # rescheduled
    assert completed == [("b", True, 2)]
    order.dispatched(["a"])
    order.finished("a", True, 1)
    assert completed == [("b", True, 2), ("a", True, 1)]


def test_an_item_answered_already_is_left_as_it_is() -> None:
    order, completed = make()
    order.dispatched(["a", "b", "c"])
    order.finished("b", True, 2)
    for item in ("a", "b"):  # the batch could not be answered: each item gets the error
        order.finished(item, False, "error")
    order.finished("c", True, 3)
    assert completed == [("a", False, "error"), ("b", True, 2), ("c", True, 3)]


def test_flush_completes_what_is_held_in_order() -> None:
    order, completed = make()
    order.dispatched(["a", "b", "c"])
    order.finished("c", True, 3)
    order.finished("b", True, 2)
    order.flush()
    assert completed == [("b", True, 2), ("c", True, 3)]

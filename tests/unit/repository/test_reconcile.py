"""POLL reconciliation (``triton_actor/repository/reconcile.py``) with a manual clock."""

from __future__ import annotations

from triton_actor.repository.reconcile import Reconciler
from triton_actor.repository.snapshot import Stamp


def _stamp(*names: str) -> Stamp:
    return Stamp(tuple((n, 1, 1) for n in names))


def test_a_change_loads_once_it_has_settled() -> None:
    r = Reconciler(settle_s=1.0)
    r.loaded("a", _stamp("a1"))
    assert r.step({"a": _stamp("a1")}, 0.0).load == []
    first = r.step({"a": _stamp("a1"), "b": _stamp("b1")}, 10.0)
    assert first.load == [] and first.settling
    growing = r.step({"a": _stamp("a1"), "b": _stamp("b1", "b2")}, 10.5)  # still being copied
    assert growing.load == [] and growing.settling
    assert r.step({"a": _stamp("a1"), "b": _stamp("b1", "b2")}, 11.0).load == []  # quiet only 0.5 s
    done = r.step({"a": _stamp("a1"), "b": _stamp("b1", "b2")}, 11.6)
    assert done.load == ["b"] and not done.settling
    assert r.step({"a": _stamp("a1"), "b": _stamp("b1", "b2")}, 20.0).load == []  # loaded: nothing to do


def test_a_failed_model_is_retried_only_when_its_files_change() -> None:
    r = Reconciler(settle_s=0.0)
    r.loaded("bad", _stamp("v1"))  # its load failed: the reconciler does not care
    for t in range(5):
        assert r.step({"bad": _stamp("v1")}, float(t)).load == []
    r.step({"bad": _stamp("v2")}, 10.0)
    assert r.step({"bad": _stamp("v2")}, 10.0).load == ["bad"]


def test_a_removed_folder_is_unloaded_and_can_come_back() -> None:
    r = Reconciler(settle_s=0.0)
    r.loaded("a", _stamp("a1"))
    assert r.step({}, 1.0).unload == ["a"]
    assert r.step({}, 2.0).unload == []
    r.step({"a": _stamp("a1")}, 3.0)
    assert r.step({"a": _stamp("a1")}, 3.0).load == ["a"]


def test_a_folder_removed_while_settling_is_forgotten() -> None:
    r = Reconciler(settle_s=1.0)
    r.step({"b": _stamp("b1")}, 0.0)
    assert not r.step({}, 0.5).settling
    assert r.step({"b": _stamp("b1")}, 5.0).load == []  # seen anew: settles again


def test_on_demand_a_new_folder_loads_nothing_and_loaded_models_follow_their_files() -> None:
    r = Reconciler(settle_s=0.0, loaded_only=True)
    for t in (0.0, 1.0):  # a folder alone: a request loads it, not a rescan
        actions = r.step({"new": _stamp("n1")}, t)
        assert actions.load == [] and not actions.settling
    r.loaded("a", _stamp("a1"))  # a request loaded it
    r.step({"a": _stamp("a2"), "new": _stamp("n1")}, 2.0)
    assert r.step({"a": _stamp("a2"), "new": _stamp("n1")}, 2.0).load == ["a"]  # its files changed: reload
    r.forget("a")  # evicted by the memory budget
    r.step({"a": _stamp("a3")}, 3.0)
    assert r.step({"a": _stamp("a3")}, 3.0).load == [] and r.step({}, 4.0).unload == []
    r.loaded("a", _stamp("a3"))
    assert r.step({}, 5.0).unload == ["a"]  # loaded, then its folder went away

"""The memory budget's decisions (``plane/memory_budget.py``) with a fake repository, host and memory meter: the
least recently used idle model goes first, busy and pinned ones never, a model whose measure exceeds its
estimate makes the others leave after its load, a refused load says budget, used and needed, a reload counts
the old version until it has drained, and ``--model-memory-budget`` reads bytes or a percentage."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import pytest

from triton_actor.config.command_line import memory_budget
from triton_actor.errors import Code, TritonError
from triton_actor.host.base import LocalHost
from triton_actor.plane.memory_budget import MemoryBudget, families
from triton_actor.runtime.kernel import Reply


class Fakes(LocalHost):
    """Models that hold ``size[name]`` bytes while loaded; ``busy`` ones have a request running. The host
    of one process (its handlers are the budget's), whose broadcast is the fake unload."""

    def __init__(self, tmp_path: Path, size: dict[str, int]) -> None:
        super().__init__()
        self.size = size
        self.held: dict[str, int] = {}
        self.busy: set[str] = set()
        self.unloads: list[str] = []
        self.repositories = [tmp_path]
        self.drained: dict[str, list[Reply[None]]] = {}  # a reload's old version: set once it has drained
        self.ref = SimpleNamespace(settled=lambda name: self.drained.setdefault(name, []).append(Reply()) or
                                   self.drained[name][-1])
        for name, n in size.items():
            (tmp_path / name).mkdir()
            (tmp_path / name / "weights").write_bytes(b"\0" * n)  # the estimate before the first load

    @property
    def routes(self) -> dict[str, Any]:
        return {n: SimpleNamespace(ready_versions=(1,), versions={1: SimpleNamespace(live_status=self._status(n))})
                for n in self.held}

    def _status(self, name: str) -> Any:
        return lambda: {"queued": 0, "running": 1 if name in self.busy else 0}

    def broadcast(self, kind: str, args: dict[str, Any] | None = None) -> list[Any]:
        assert kind == "model.unload" and args is not None and args["wait"]
        self.unloads.append(args["name"])
        self.held.pop(args["name"])
        return [None]

    def budget(self, limit: int) -> MemoryBudget:
        budget = MemoryBudget(limit, self, self, measure=lambda: sum(self.held.values()))  # type: ignore[arg-type]
        budget._clock = itertools.count().__next__  # type: ignore[assignment]  # each use later than the last
        budget.slack = 0  # estimates are the files' sizes alone
        return budget

    def load(self, budget: MemoryBudget, name: str, actual: int | None = None) -> None:
        budget.touch(name)
        budget.load(name, lambda: self.held.__setitem__(name, actual or self.size[name]))


def test_the_least_recently_used_idle_unpinned_model_goes_first(tmp_path: Path) -> None:
    f = Fakes(tmp_path, {"a": 100, "b": 100, "c": 100, "d": 100})
    budget = f.budget(250)
    f.load(budget, "a")
    f.load(budget, "b")
    budget.touch("a")  # a used after b
    f.load(budget, "c")
    assert f.unloads == ["b"] and set(f.held) == {"a", "c"} and budget.used() == 200
    f.busy.add("a")  # the least recently used, but serving: c goes
    f.load(budget, "d")
    assert f.unloads == ["b", "c"] and budget.evictions == 2
    assert [m["model"] for m in budget.status()["lru"]] == ["a", "d"]


def test_a_load_is_refused_when_only_pinned_models_hold_the_budget_or_the_model_is_bigger(tmp_path: Path) -> None:
    f = Fakes(tmp_path, {"pinned": 100, "busy": 100, "next": 100, "huge": 500})
    budget = f.budget(250)
    f.held["pinned"] = 100
    budget.pin(["pinned"], 100)
    f.load(budget, "busy")
    f.busy.add("busy")
    f.load(budget, "next")  # busy is drained rather than the load refused
    assert f.unloads == ["busy"]
    f.held["pinned"] = budget.pinned_bytes = 200
    with pytest.raises(TritonError) as e:
        f.load(budget, "busy")
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message == ("failed to load 'busy': it needs about 100 bytes, more than the model memory budget "
                               "of 250 bytes leaves beside the pinned models (200 bytes; 300 used now)")
    with pytest.raises(TritonError, match="needs about 500 bytes, more than the model memory budget of 250 bytes"):
        f.load(budget, "huge")
    assert f.unloads == ["busy"] and budget.refusals == 2 and budget.resident == {"next": 100}


def test_a_model_bigger_than_estimated_makes_the_others_leave_after_its_load(tmp_path: Path) -> None:
    f = Fakes(tmp_path, {"a": 100, "b": 10})
    budget = f.budget(250)
    f.load(budget, "a")
    f.load(budget, "b", actual=200)  # estimated 10 from its files, measured 200
    assert f.unloads == ["a"] and budget.resident == {"b": 200} and budget.footprint == {"a": 100, "b": 200}


def test_a_model_unloaded_through_the_api_leaves_the_accounting(tmp_path: Path) -> None:
    f = Fakes(tmp_path, {"a": 100, "b": 200})
    budget = f.budget(250)
    f.load(budget, "a")
    del f.held["a"]  # the unload API
    f.load(budget, "b")
    assert f.unloads == [] and budget.resident == {"b": 200}
    names = {fam["name"]: fam["series"] for fam in families(2, budget)}
    assert names["nv_model_load_on_demand_total"] == [{"labels": {}, "value": 2}]
    assert names["nv_model_memory_resident_bytes"] == [{"labels": {"model": "b"}, "value": 200}]
    assert [fam["name"] for fam in families(0, None)] == ["nv_model_load_on_demand_total"]


def test_the_flag_reads_bytes_suffixes_and_percentages() -> None:
    assert memory_budget("") == 0
    assert memory_budget("1000") == 1000
    assert memory_budget("2G") == 2 << 30 and memory_budget("1.5M") == 3 << 19
    assert 0 < memory_budget("10%") < memory_budget("20%")
    for bad in ("0", "-1", "lots", "150%", "0%"):
        with pytest.raises(SystemExit):
            memory_budget(bad)


def test_a_loaded_model_nobody_measured_is_counted_at_its_estimate_and_can_be_evicted(tmp_path: Path) -> None:
    """A worker whose deciding peer died during a load holds the model with no share of it anywhere."""
    f = Fakes(tmp_path, {"orphan": 100, "a": 100, "b": 100})
    budget = f.budget(250)
    f.held["orphan"] = 100  # loaded, never measured
    f.load(budget, "a")
    f.load(budget, "b")  # 300 with the orphan: it is the least recently used, it goes
    assert f.unloads == ["orphan"] and set(f.held) == {"a", "b"}


def test_a_reload_counts_the_old_version_until_it_has_drained(tmp_path: Path) -> None:
    """The new version loads beside the old one, which drains after the swap: both count until the model
    actor says the old one is gone (before, the old one's bytes left the accounting at the reload)."""
    f = Fakes(tmp_path, {"a": 100, "b": 100})
    budget = f.budget(250)
    f.load(budget, "a")
    f.load(budget, "a")  # a reload: 200 of 250, the old version draining
    assert budget.resident == {"a": 100} and budget.used() == 200 and budget.status()["draining_bytes"] == 100
    f.load(budget, "b")  # 100 more fits only once the new a goes: the draining old one is still there
    assert f.unloads == ["a"] and budget.resident == {"b": 100} and budget.used() == 200
    f.drained["a"][0].set(None)  # the old version drained and unloaded
    gevent.idle()  # (the reply's link runs in the hub)
    assert budget.used() == 100 and budget.draining == {}
    f.load(budget, "a")
    with pytest.raises(TritonError) as e:  # 150: a reload of b cannot fit beside b, and a goes first
        budget.limit = 150
        f.load(budget, "b")
    assert f.unloads == ["a", "a"] and budget.resident == {"b": 100} and budget.used() == 100
    assert e.value.message == (
        "failed to load 'b': model memory budget exhausted: 100 of 150 bytes used (0 by pinned models), about 100 "
        "needed, and no loaded model can be unloaded; a reload holds both versions until the old one (100 bytes) "
        "has drained: unload the model first to load it again within the budget")

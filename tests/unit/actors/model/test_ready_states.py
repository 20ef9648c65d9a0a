"""Ready states (``actors/model/handles.py``): the enum, its transition table, and the one place it is enforced."""

from __future__ import annotations

import itertools
import json

import pytest

from triton_actor.actors.model.handles import (
    LOADING,
    READY,
    TRANSITIONS,
    UNAVAILABLE,
    UNKNOWN,
    UNLOADING,
    IllegalTransition,
    ReadyState,
    check_transition,
)
from triton_actor.actors.model.version import Version
from triton_actor.errors import TritonError
from triton_actor.protocol import v2_grpc

LEGAL = {
    (UNKNOWN, LOADING), (UNKNOWN, UNAVAILABLE),
    (LOADING, READY), (LOADING, UNAVAILABLE),
    (READY, UNLOADING), (READY, UNAVAILABLE),
    (UNLOADING, UNAVAILABLE),
    (UNAVAILABLE, LOADING),
}


def test_states_are_the_strings_triton_clients_read() -> None:
    assert [s.value for s in ReadyState] == ["UNKNOWN", "LOADING", "READY", "UNLOADING", "UNAVAILABLE"]
    assert READY == "READY" and f"{UNAVAILABLE}" == "UNAVAILABLE" and str(LOADING) == "LOADING"
    assert json.dumps({"state": UNLOADING}) == '{"state": "UNLOADING"}'
    assert set(TRANSITIONS) == set(ReadyState)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(ReadyState, ReadyState)))
def test_the_table_is_enforced(old: ReadyState, new: ReadyState) -> None:
    if old is new or (old, new) in LEGAL:
        assert check_transition(old, new) is new
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition(old, new)
        assert not isinstance(info.value, TritonError) and f"{old.value} → {new.value}" in str(info.value)


def test_version_records_change_state_only_along_the_table() -> None:
    rec = Version(1, LOADING)
    rec.to(READY)
    rec.to(READY, "update failed, the previous version keeps serving: x")  # a new reason, same state
    assert (rec.state, rec.reason) == (READY, "update failed, the previous version keeps serving: x")
    with pytest.raises(IllegalTransition):
        rec.to(LOADING)  # a reload gets a record of its own
    rec.to(UNLOADING)
    rec.to(UNAVAILABLE, "unloaded")
    assert (rec.state, rec.reason) == (UNAVAILABLE, "unloaded")
    with pytest.raises(IllegalTransition):
        Version(2, READY)  # born UNKNOWN: READY only after LOADING
    with pytest.raises(IllegalTransition):
        Version(2, UNLOADING)


def test_the_grpc_index_carries_the_plain_string() -> None:
    msg = v2_grpc.repository_index([{"name": "m", "version": "1", "state": READY.value},
                                    {"name": "n", "state": UNAVAILABLE}])  # even a member would do
    assert [m.state for m in msg.models] == ["READY", "UNAVAILABLE"]
    assert type(msg.models[1].state) is str

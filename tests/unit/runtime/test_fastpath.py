"""The fast-path seam: bounded caches and the one switch."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from triton_actor.runtime import fastpath


class _Pair(NamedTuple):
    a: int
    b: int


@pytest.fixture
def restore_switch():
    before = fastpath.enabled
    yield
    fastpath.set_enabled(before)


def test_a_cache_never_holds_more_than_its_size(restore_switch) -> None:
    fastpath.set_enabled(True)
    c = fastpath.BoundedCache("t", 3)
    for i in range(10):
        c.put(i, str(i))
        assert len(c) <= 3
    assert c.get(9) == "9"  # the newest entry survives a clear


def test_switching_off_empties_the_caches_and_every_get_misses(restore_switch) -> None:
    fastpath.set_enabled(True)
    shared = fastpath.cache("test_fastpath.shared", 8)
    assert fastpath.cache("test_fastpath.shared", 99) is shared
    shared.put("k", 1)
    assert shared.get("k") == 1
    fastpath.set_enabled(False)
    assert len(shared) == 0 and shared.get("k") is None
    shared.put("k", 1)
    assert shared.get("k") is None and len(shared) == 0
    fastpath.set_enabled(True)
    shared.put("k", 2)
    assert shared.get("k") == 2
    assert "test_fastpath.shared" in fastpath.caches()


def test_a_cache_built_while_off_looks_up_once_the_switch_is_on(restore_switch) -> None:
    """A cache made while fast paths were off (one an object owns, not registered, e.g. a validator's
    memo built in a test or at import) misses while they are off, and hits what it stores once they are on."""
    fastpath.set_enabled(False)
    own = fastpath.BoundedCache("t", 4)
    own.put("k", 1)
    assert own.get("k") is None
    fastpath.set_enabled(True)
    assert own.get("k") is None
    own.put("k", 2)
    assert own.get("k") == 2


def test_new_tuple_is_checked_only_on_the_slow_path(restore_switch) -> None:
    fastpath.set_enabled(True)
    assert fastpath.new_tuple(_Pair, (1, 2)) == _Pair(1, 2)
    assert type(fastpath.new_tuple(_Pair, (1, 2))) is _Pair
    fastpath.set_enabled(False)
    assert fastpath.new_tuple(_Pair, (1, 2)) == _Pair(1, 2)
    with pytest.raises(TypeError):
        fastpath.new_tuple(_Pair, (1,))


def test_a_cache_needs_room_for_one_entry() -> None:
    with pytest.raises(ValueError):
        fastpath.BoundedCache("t", 0)


def test_the_command_line_switch_wins_over_the_environment() -> None:
    from triton_actor.config.command_line import parse

    assert parse(["--model-repository", "x", "--fast-paths=false"]).fast_paths is False
    assert parse(["--model-repository", "x", "--fast-paths"]).fast_paths is True
    assert parse(["--model-repository", "x"]).fast_paths is fastpath.enabled

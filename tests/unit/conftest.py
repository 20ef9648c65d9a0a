"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from triton_actor.runtime import fastpath


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def fast_paths(request: pytest.FixtureRequest) -> Iterator[None]:
    """The test runs with every fast path (the caches keyed by request bytes) and without them."""
    before = fastpath.enabled
    fastpath.set_enabled(request.param)
    yield
    fastpath.set_enabled(before)

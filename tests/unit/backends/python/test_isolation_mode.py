"""Which Python models run in a process of their own (backends/python/isolated.py: isolation_mode)."""

from __future__ import annotations

import pytest

from triton_actor.backends.python.isolated import isolation_mode
from triton_actor.errors import TritonError
from triton_actor.repository.config import ModelConfig


def _parameters(value: str | None) -> object:
    config = ModelConfig()
    if value is not None:
        config.parameters["TRITON_ACTOR_ISOLATION"].string_value = value
    return config.parameters


@pytest.mark.parametrize(("parameter", "server", "mode"), [
    (None, {}, "thread"),  # the default: in-process
    (None, {"isolation": "process"}, "process"),  # --backend-config=python,isolation=process
    ("thread", {"isolation": "process"}, "thread"),  # the model's parameter wins
    (" Process ", {}, "process"),
])
def test_mode(parameter: str | None, server: dict[str, str], mode: str) -> None:
    assert isolation_mode(_parameters(parameter), server) == mode


def test_a_bad_value_names_where_it_came_from() -> None:
    with pytest.raises(TritonError, match="parameter TRITON_ACTOR_ISOLATION: expected 'thread' or 'process', got 'fork'"):
        isolation_mode(_parameters("fork"), {})
    with pytest.raises(TritonError, match="--backend-config=python,isolation: expected"):
        isolation_mode(_parameters(None), {"isolation": "yes"})
